"""Live health checks from the seeds' trouble-shooting tables (seed 000 §5.2, seed 003 §6.3).

Each check looks at one step's metrics and, the first time it trips, returns a warning of the
form ``"name: what happened → what to try"``. The trainer prints it once and records it as an
MLflow tag; later trips of the same check are counted, not repeated.
"""

from __future__ import annotations

from typing import Any


class HealthMonitor:
    def __init__(self, settings: Any):
        self.settings = settings
        self.fired: dict[str, int] = {}
        self._first_length: float | None = None

    def _trip(self, name: str, message: str, out: list[str]) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1
        if self.fired[name] == 1:
            out.append(f"{name}: {message}")

    def check(self, step: int, metrics: dict[str, float]) -> list[str]:
        s = self.settings
        warnings: list[str] = []
        entropy = metrics.get("actor/entropy")
        if entropy is not None and entropy < s.min_entropy:
            self._trip("entropy_collapse", f"entropy {entropy:.3f} < {s.min_entropy} → raise the clip upper bound (clip_high) or add an entropy bonus", warnings)
        z = metrics.get("advantage/max_abs_z")
        if z is not None and z > s.advantage_sigma:
            self._trip("advantage_outliers", f"an advantage lies {z:.1f}σ from the mean (> ±{s.advantage_sigma}σ) → check reward scale and advantage normalisation", warnings)
        share = metrics.get("actor/pos_loss_share")
        if share is not None and share > 0 and abs(share - s.positive_share_target) > s.positive_share_tolerance:
            self._trip("positive_share", f"positive-advantage loss share {share:.2f} far from target {s.positive_share_target} → consider BAPO's adaptive clipping", warnings)
        length = metrics.get("rollout/response_length/mean")
        if length is not None:
            if self._first_length is None:
                self._first_length = length
            if length < s.min_mean_length or (self._first_length > 4 * s.min_mean_length and length < 0.25 * self._first_length):
                self._trip("length_collapse", f"mean response length {length:.1f} collapsed (start {self._first_length:.1f}) → check length bias; try Dr.GRPO", warnings)
        metrics.update({f"health/{name}_trips": float(count) for name, count in self.fired.items()})
        return warnings

    def state_dict(self) -> dict[str, Any]:
        return {"fired": dict(self.fired), "first_length": self._first_length}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fired = dict(state.get("fired", {}))
        self._first_length = state.get("first_length")
