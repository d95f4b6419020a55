"""Live health checks (polyrl's own trouble-shooting heuristics; the thresholds are settings).

Each check looks at one step's metrics and, the first time it trips, returns a warning of the
form ``"name: what happened → what to try"``. The health hook prints it and records it as an
MLflow tag; later trips of the same check are counted, not repeated, except for skipped
non-finite optimizer steps (:mod:`polyrl.learner.nonfinite`), which are reported every time they happen.
"""

from __future__ import annotations

from typing import Any

from polyrl.learner.nonfinite import NONFINITE_REASONS
from polyrl.monitoring.reward_hacking import RewardHackingMonitor

# Below this mismatch KL per token the sampler and learner differ by float rounding only (fp32:
# ~1e-12; a bf16 sampler: ~1e-5 at 30M parameters): growth under it is no signal.
MISMATCH_KL_FLOOR = 1e-5
MISMATCH_BASELINE_REPORTS = 3


class HealthMonitor:
    def __init__(
        self,
        settings: Any,
        *,
        check_logprob_gap: bool = True,
        sampler_dtype: str = "float32",
        check_overlap: bool = False,
        reward_weights: dict[str, float] | None = None,
        held_out: bool = True,
        eval_every: int = 0,
        steps: int = 0,
    ):
        self.settings = settings
        # The reward-hacking checks (monitoring/reward_hacking.py): per-sample signals and the held-out
        # trend (evaluations every ``eval_every`` of the run's ``steps``: a window too short is said once).
        self.reward_hacking = RewardHackingMonitor(
            settings, reward_weights=reward_weights, held_out=held_out, eval_every=eval_every, steps=steps
        )
        # Set-up warnings ("name: what → what to try"), said when the loop starts and tagged.
        self.notes: list[str] = list(self.reward_hacking.notes)
        # Asynchronous training (rollout.max_staleness > 0): the buffer-utilisation and communication
        # figures (polyrl's own heuristics), as running means over the steps that report them.
        self.check_overlap = check_overlap
        self.overlap_sums: dict[str, float] = {}
        self.overlap_counts: dict[str, int] = {}
        # A bf16 sampler differs from the learner by rounding too (~4e-3 nats/token at 30M), so
        # its warning names that cause beside a stale sync.
        self.sampler_dtype = sampler_dtype
        # With top_p < 1 the sampler's log-probs are renormalised over the nucleus, so the gap
        # is not a sync check (rollout.py) and this check is off.
        self.check_logprob_gap = check_logprob_gap
        self.fired: dict[str, int] = {}
        self._first_length: float | None = None
        self._mismatch_baseline: list[float] = []  # rollout_corr/k3_kl of the first reports

    def _trip(self, name: str, message: str, out: list[str], *, every_time: bool = False) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1
        if self.fired[name] == 1 or every_time:
            out.append(f"{name}: {message}")

    def check(self, step: int, metrics: dict[str, float]) -> list[str]:
        s = self.settings
        warnings: list[str] = []
        for reason, what in NONFINITE_REASONS.items():
            skipped = metrics.get(f"health/nonfinite_{reason}_steps", 0.0)
            if skipped:
                self._trip(f"nonfinite_{reason}", f"{int(skipped)} optimizer step(s) skipped: the {what} was NaN/inf, the weights "
                           "were left unchanged → check rewards and advantages for NaN/inf, lower the learning rate", warnings,
                           every_time=True)  # fmt: skip
        gap = metrics.get("rollout/logprob_gap")
        if self.check_logprob_gap and gap is not None and gap > s.max_logprob_gap:
            self._trip(
                "logprob_gap",
                f"sampler/learner log-prob gap {gap:.3g} nats/token > {s.max_logprob_gap:g} → the rollout "
                "engine samples from other weights than the learner's (a stale or partial weight sync)"
                + (
                    ""
                    if self.sampler_dtype == "float32"
                    else f", or {self.sampler_dtype} rounding in the sampler: if the gap "
                    "holds steady, raise health.max_logprob_gap"
                ),
                warnings,
            )
        if self.check_logprob_gap:
            self._check_mismatch(metrics, warnings)
        self._check_unmeasured_mismatch(metrics, warnings)
        self._check_nothing_trained(metrics, warnings)
        kept_groups = metrics.get("rollout/dynamic_sampling_kept_groups")
        if kept_groups is not None and kept_groups == 0:
            self._trip(
                "no_informative_groups",
                "dynamic sampling kept no group (every group's rewards agreed), so the step made "
                "no update → raise advantage.dynamic_sampling.max_rounds or use a reward that separates samples",
                warnings,
            )
        entropy = metrics.get("actor/entropy")
        if entropy is not None and entropy < s.min_entropy:
            self._trip(
                "entropy_collapse",
                f"entropy {entropy:.3f} < {s.min_entropy} → raise the clip upper bound (clip_high) or add an entropy bonus",
                warnings,
            )
        z = metrics.get("advantage/max_abs_z")
        if z is not None and z > s.advantage_sigma:
            self._trip(
                "advantage_outliers",
                f"an advantage lies {z:.1f}σ from the mean (> ±{s.advantage_sigma}σ) → check reward scale and advantage normalisation",
                warnings,
            )
        share = metrics.get("actor/pos_loss_share")
        if share is not None and share > 0 and abs(share - s.positive_share_target) > s.positive_share_tolerance:
            self._trip(
                "positive_share",
                f"positive-advantage loss share {share:.2f} far from target {s.positive_share_target} → consider BAPO's adaptive clipping",
                warnings,
            )
        length = metrics.get("rollout/response_length/mean")
        if length is not None:
            if self._first_length is None:
                self._first_length = length
            if length < s.min_mean_length or (self._first_length > 4 * s.min_mean_length and length < 0.25 * self._first_length):
                self._trip(
                    "length_collapse",
                    f"mean response length {length:.1f} collapsed (start {self._first_length:.1f}) → check length bias; try Dr.GRPO",
                    warnings,
                )
        if self.check_overlap:
            self._check_overlap(metrics, warnings)
        metrics.update({f"health/{name}_trips": float(count) for name, count in self.fired.items()})
        return warnings

    def check_samples(
        self, step: int, samples: list[dict[str, Any]], parts: dict[str, list[float | None]], metrics: dict[str, float]
    ) -> list[str]:
        """The reward-hacking checks on one step's samples (reward vs length, distinct completions,
        component correlations and shares, judge vs rule); adds their figures to ``metrics``."""
        warnings = self.reward_hacking.check_samples(samples, parts, metrics, self._trip)
        metrics.update({f"health/{name}_trips": float(count) for name, count in self.fired.items()})
        return warnings

    def check_held_out(self, step: int, metrics: dict[str, float]) -> list[str]:
        """Training reward vs the held-out score, once the step's periodic evaluation is in ``metrics``."""
        warnings = self.reward_hacking.check_held_out(step, metrics, self._trip)
        metrics.update({f"health/{name}_trips": float(count) for name, count in self.fired.items()})
        return warnings

    def _check_mismatch(self, metrics: dict[str, float], warnings: list[str]) -> None:
        """The sampler/learner mismatch KL (rollout_corr/k3_kl): above health.max_mismatch_kl, or grown
        past health.mismatch_growth times its mean over the first reports ("When Speed Kills Stability",
        Liu, Li et al. 2025: the mismatch grows before training collapses)."""
        s = self.settings
        kl = metrics.get("rollout_corr/k3_kl")
        if kl is None:
            return
        cure = (
            "→ correct it (objective.rollout_correction, docs/rollout_correction.md: e.g. mode decoupled with is_level "
            "token, or a geometric rejection band), sample in the learner's dtype (rollout.dtype), or check the weight sync"
        )
        if kl > s.max_mismatch_kl:
            self._trip("mismatch_kl", f"sampler/learner mismatch KL {kl:.3g} per token > {s.max_mismatch_kl:g} {cure}", warnings)
        if len(self._mismatch_baseline) < MISMATCH_BASELINE_REPORTS:
            self._mismatch_baseline.append(kl)
            return
        baseline = sum(self._mismatch_baseline) / len(self._mismatch_baseline)
        if kl > MISMATCH_KL_FLOOR and kl > s.mismatch_growth * baseline:
            self._trip(
                "mismatch_growth",
                f"sampler/learner mismatch KL {kl:.3g} per token grew past {s.mismatch_growth:g}x its starting "
                f"{baseline:.3g} {cure}",
                warnings,
            )

    def _check_unmeasured_mismatch(self, metrics: dict[str, float], warnings: list[str]) -> None:
        """A step whose update measured no sampler/learner mismatch (rollout_corr/rows_measured 0):
        says why once, and the step's rollout_corr/rows_* say it every step. The learner compares only
        rows sampled by the weights it holds (polyrl/learner/policy_learner.py, rows_to_diagnose)."""
        if "rollout/logprob_gap" in metrics or metrics.get("rollout_corr/rows_measured", 1.0) > 0:
            return
        newer = metrics.get("rollout_corr/rows_other_version", 0.0)
        older = metrics.get("rollout_corr/rows_older_weights", 0.0)
        if newer:
            self._trip(
                "mismatch_unmeasured",
                f"{int(newer)} rows carry a policy version the learner's weights do not (newer than its own), so the "
                "sampler/learner mismatch (rollout/logprob_gap, rollout_corr/*) was not measured → the engine's weight "
                "versions and the learner's disagree: check that every weight sync reaches the engine",
                warnings,
            )
        elif older:
            self._trip(
                "mismatch_unmeasured",
                f"no row the update could compare was sampled by the learner's own weights ({int(older)} came from older "
                "weights, asynchronous training's staleness ≥ 1, which the learner no longer holds), so the sampler/learner "
                "mismatch (rollout/logprob_gap, rollout_corr/*) is measured only on steps with staleness-0 rows "
                "(rollout_corr/rows_measured > 0; each step logs its rows_older_weights); expected under "
                "rollout.max_staleness ≥ 1 → for a sync check on every step, run a few steps with rollout.max_staleness 0",
                warnings,
            )

    def _check_nothing_trained(self, metrics: dict[str, float], warnings: list[str]) -> None:
        """Steps that had samples and trained on none of them: every sample unscored (a reward with
        allow_unscored), or every token rejected by the rollout correction's bands."""
        samples, unscored = metrics.get("rollout/samples", 0.0), metrics.get("reward/unscored")
        if samples > 0 and unscored is not None and unscored >= samples:
            self._trip(
                "all_unscored",
                f"every one of the step's {int(samples)} samples is unscored (a reward with allow_unscored: true returned "
                "None for each), so the step trained on nothing → check that the data has what the reward reads "
                "(references, an answer field), or that the reward scores this kind of completion",
                warnings,
            )
        masked = metrics.get("rollout_corr/masked_token_fraction")
        if masked is not None and masked >= 1.0 - 1e-6 and metrics.get("train/samples", 0.0) > 0:
            self._trip(
                "correction_masked_everything",
                "the rollout correction's rejection masked every token of the step (rollout_corr/masked_token_fraction "
                "1), so the step trained on nothing → widen the bands of objective.rollout_correction (mis, geometric, "
                "icepop low/high; k3_threshold; opsm_threshold), or check the sampler (rollout/logprob_gap)",
                warnings,
            )

    def _running_mean(self, key: str, metrics: dict[str, float]) -> tuple[float, int] | None:
        if key not in metrics:
            return None
        self.overlap_sums[key] = self.overlap_sums.get(key, 0.0) + metrics[key]
        self.overlap_counts[key] = self.overlap_counts.get(key, 0) + 1
        return self.overlap_sums[key] / self.overlap_counts[key], self.overlap_counts[key]

    def _check_overlap(self, metrics: dict[str, float], warnings: list[str]) -> None:
        """Checked on running means from the third report on: one step's value is noisy (with k = 1
        a step's utilisation is 0, 1/2 or 1)."""
        s = self.settings
        utilisation = self._running_mean("async/buffer_utilisation", metrics)
        if utilisation is not None:
            metrics["async/buffer_utilisation_mean"] = utilisation[0]
            if utilisation[1] >= 3 and utilisation[0] < s.min_buffer_utilisation:
                self._trip(
                    "buffer_utilisation",
                    f"rollout buffer utilisation {utilisation[0]:.0%} < {s.min_buffer_utilisation:.0%}: the "
                    "learner waits for generation → raise rollout.max_staleness, or make generation cheaper (rollout.dtype "
                    "bfloat16, fewer rollout.max_tokens)",
                    warnings,
                )
        share = self._running_mean("perf/sync_share", metrics)
        if share is not None:
            metrics["perf/sync_share_mean"] = share[0]
            if share[1] >= 3 and share[0] > s.max_sync_share:
                self._trip(
                    "communication",
                    f"weight syncs take {share[0]:.0%} of a step > {s.max_sync_share:.0%} → sync a smaller "
                    "dtype (rollout.dtype bfloat16), or train LoRA adapters (model.lora)",
                    warnings,
                )

    def state_dict(self) -> dict[str, Any]:
        state = {
            "fired": dict(self.fired),
            "first_length": self._first_length,
            "mismatch_baseline": list(self._mismatch_baseline),
        }
        if self.check_overlap:
            state["overlap"] = {"sums": dict(self.overlap_sums), "counts": dict(self.overlap_counts)}
        state["reward_hacking"] = self.reward_hacking.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fired = dict(state.get("fired", {}))
        self._first_length = state.get("first_length")
        self._mismatch_baseline = list(state.get("mismatch_baseline", []))
        overlap = state.get("overlap", {})
        self.overlap_sums, self.overlap_counts = dict(overlap.get("sums", {})), dict(overlap.get("counts", {}))
        self.reward_hacking.load_state_dict(state.get("reward_hacking", {}))
