"""The reward-hacking checks of the health monitor: the history the signals of
:mod:`polyrl.rewards.monitors` need, and when a signal is a warning.

Two entry points, because their data arrive at different moments of a step: :meth:`check_samples`
reads the step's samples and per-component scores (the health hook's observe), and
:meth:`check_held_out` reads the held-out score the periodic evaluation adds after it (the hook's
publish; the step-0 evaluation once the loop has started). Warnings use the health monitor's ``"name: what happened → what to try"`` form and
its fire-once bookkeeping (``trip``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from polyrl.config.base import ConfigError
from polyrl.rewards.monitors import (
    component_correlations,
    component_shares,
    distinct_per_prompt,
    held_out_divergence,
    pearson,
)

Trip = Callable[[str, str, list], None]


def default_held_out(key: str) -> bool:
    """The held-out scores checked when health.held_out_metric is unset."""
    return key.startswith("eval/") and key.count("/") >= 2 and (key.endswith("/accuracy") or key.endswith("/reward/mean"))


def held_out_blind_note(settings: Any, *, eval_every: int, steps: int) -> str | None:
    """Why the held-out divergence check can never fire with these settings, or None.

    :func:`~polyrl.rewards.monitors.held_out_divergence` needs two held-out points within
    ``health.reward_window`` steps of the last one; periodic evaluation gives one at step 0 and
    every ``eval.every`` steps after, so a window shorter than ``eval.every`` (or a run shorter
    than it: the step-0 evaluation alone) never holds two."""
    window = settings.reward_window
    if not eval_every:
        return None
    if steps < eval_every:
        return (
            f"held_out_blind: train.steps {steps} < eval.every {eval_every}, so periodic evaluation scores the policy once "
            "(step 0) and the held-out divergence check (training reward up, held-out score flat) cannot compare two "
            f"evaluations → set eval.every to at most {steps}"
        )
    if window < eval_every:
        return (
            f"held_out_blind: health.reward_window {window} < eval.every {eval_every}: the held-out divergence check "
            "(training reward up, held-out score flat) needs two evaluations within its window and never gets them "
            f"→ set health.reward_window to at least {eval_every}, or eval.every to at most {window}"
        )
    return None


class RewardHackingMonitor:
    def __init__(
        self,
        settings: Any,
        *,
        reward_weights: dict[str, float] | None = None,
        held_out: bool = True,
        eval_every: int = 0,
        steps: int = 0,
    ):
        self.settings = settings
        self.weights = dict(reward_weights or {})
        # Said once when the loop starts (the health hook's notes): a check these settings leave blind.
        note = held_out_blind_note(settings, eval_every=eval_every, steps=steps) if held_out else None
        self.notes: list[str] = [note] if note else []
        if settings.held_out_metric and not held_out:
            raise ConfigError(
                f"health.held_out_metric: {settings.held_out_metric!r} is checked against periodic evaluation, "
                "which this run does not do; set eval.every and eval.suite, or remove health.held_out_metric"
            )
        if self.weights:  # labels known (training builds them); a bare monitor in a test may skip this
            for judge, rule in settings.judge_rule_pairs.items():
                for label in (judge, rule):
                    if label not in self.weights:
                        raise ConfigError(
                            f"health.judge_rule_pairs: no reward is labelled {label!r}; reward labels: {', '.join(self.weights)}"
                        )
        self.train: list[tuple[int, float]] = []
        self.held: dict[str, list[tuple[int, float]]] = {}
        self.signs: dict[str, int] = {}  # "a|b" → the sign their correlation first took (|r| >= threshold)
        self.first_shares: dict[str, float] | None = None
        window = settings.reward_window
        self.length_corrs: deque[float] = deque(maxlen=window)
        self.judge_pool: dict[str, deque[tuple[list, list]]] = {j: deque(maxlen=window) for j in settings.judge_rule_pairs}

    # -- per-step samples (observe) --------------------------------------------------------------
    def check_samples(
        self, samples: list[dict[str, Any]], parts: dict[str, list[float | None]], metrics: dict[str, float], trip: Trip
    ) -> list[str]:
        s = self.settings
        out: list[str] = []
        if not samples:
            return out
        rewards = [row.get("reward") for row in samples]
        lengths = [row.get("length") for row in samples]
        r = pearson(rewards, [None if n is None else float(n) for n in lengths])
        if r is not None:
            self.length_corrs.append(r)
            metrics["health/reward_length_corr"] = r
            mean = sum(self.length_corrs) / len(self.length_corrs)
            if len(self.length_corrs) >= min(3, s.reward_window) and mean > s.max_length_correlation:
                trip(
                    "reward_length",
                    f"reward and completion length correlate at {mean:.2f} over the last {len(self.length_corrs)} steps "
                    f"(> {s.max_length_correlation:g}): the reward pays for length → add a length-independent check, "
                    "normalise the reward by length, or use an objective without length bias (Dr.GRPO)",
                    out,
                )
        distinct = distinct_per_prompt(
            [str(row.get("prompt", "")) for row in samples], [str(row.get("completion", "")) for row in samples]
        )
        if distinct is not None:
            metrics["health/distinct_per_prompt"] = distinct
            if distinct < s.min_distinct_per_prompt:
                trip(
                    "completion_collapse",
                    f"{distinct:.2f} distinct completions per prompt (< {s.min_distinct_per_prompt:g}): different prompts get "
                    "the same few texts back → look at the sample table for a text the reward over-pays; raise the "
                    "entropy bonus or the temperature",
                    out,
                )
        parts = {label: list(values) for label, values in parts.items() if len(values) == len(samples)}
        self._components(parts, metrics, trip, out)
        self._judge_rule(parts, metrics, trip, out)
        return out

    def _components(self, parts: dict[str, list], metrics: dict[str, float], trip: Trip, out: list[str]) -> None:
        s = self.settings
        threshold = s.min_component_correlation
        for (a, b), r in component_correlations(parts).items():
            key = f"{a}|{b}"
            metrics[f"health/component_corr/{a}__{b}"] = r
            if abs(r) < threshold:
                continue
            sign = 1 if r > 0 else -1
            first = self.signs.setdefault(key, sign)
            if sign != first:
                trip(
                    f"component_against/{a}__{b}",
                    f"reward components {a!r} and {b!r} correlated {'+' if first > 0 else '-'} over the samples and now at "
                    f"{r:+.2f}: one term pays for what the other punishes → read the samples where they disagree, "
                    "reweight or fix the term being gamed",
                    out,
                )
        shares = component_shares(parts, self.weights)
        if shares is None:
            return
        for label, share in shares.items():
            metrics[f"health/component_share/{label}"] = share
        if self.first_shares is None:
            self.first_shares = dict(shares)
            return
        for label, share in shares.items():
            if share > s.max_component_share and self.first_shares.get(label, 0.0) <= s.max_component_share:
                trip(
                    f"component_dominates/{label}",
                    f"reward component {label!r} now carries {share:.0%} of the total reward's variance (> "
                    f"{s.max_component_share:.0%}; {self.first_shares.get(label, 0.0):.0%} at the start): it alone "
                    "decides the advantage → check whether it is being gamed, or lower its weight",
                    out,
                )

    def _judge_rule(self, parts: dict[str, list], metrics: dict[str, float], trip: Trip, out: list[str]) -> None:
        s = self.settings
        for judge, rule in s.judge_rule_pairs.items():
            if judge not in parts or rule not in parts:
                continue
            pool = self.judge_pool[judge]
            pool.append((list(parts[judge]), list(parts[rule])))
            js = [v for j, _ in pool for v in j]
            rs = [v for _, r in pool for v in r]
            r = pearson(js, rs)
            if r is None:
                continue
            metrics[f"health/judge_rule_corr/{judge}"] = r
            # One step's few samples make a noisy correlation: judged once the pool holds three steps.
            if len(pool) >= min(3, s.reward_window) and r < s.min_judge_rule_correlation:
                trip(
                    f"judge_drift/{judge}",
                    f"judge {judge!r} and rule {rule!r} correlate at {r:.2f} over the last {len(pool)} steps' samples "
                    f"(< {s.min_judge_rule_correlation:g}): the judge's scores drifted from the check → read the "
                    "samples they disagree on (the rollout inspector's filter); the policy may be writing for the judge",
                    out,
                )

    # -- held-out score (publish: after the periodic evaluation) -----------------------------------
    def check_held_out(self, step: int, metrics: dict[str, float], trip: Trip) -> list[str]:
        s = self.settings
        out: list[str] = []
        if "reward/mean" in metrics:
            self.train.append((step, float(metrics["reward/mean"])))
        wanted = [s.held_out_metric] if s.held_out_metric else [k for k in metrics if default_held_out(k)]
        evaluated = sorted(k for k in metrics if k.startswith("eval/"))
        if s.held_out_metric and evaluated and s.held_out_metric not in metrics:
            # A misspelt key would otherwise leave the check silently off for the whole run.
            trip(
                "held_out_metric_missing",
                f"health.held_out_metric {s.held_out_metric!r} is not among this step's eval metrics, so the "
                f"held-out check cannot run → set it to one of: {', '.join(evaluated[:12])}",
                out,
            )
        for key in wanted:
            if key not in metrics:
                continue
            points = self.held.setdefault(key, [])
            points.append((step, float(metrics[key])))
            found = held_out_divergence(
                self.train, points, window=s.reward_window, min_rise=s.min_reward_rise, stall=s.held_out_stall
            )
            if found is not None:
                trip(
                    f"held_out_divergence/{key}",
                    f"reward/mean rose by {found['train_change']:+.3g} over steps {int(found['first_step'])}–"
                    f"{int(found['last_step'])} while {key} moved {found['held_out_change']:+.3g}: the policy is learning "
                    "the reward, not the task → read the samples with the highest reward, tighten the reward, or stop here",
                    out,
                )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "train": [list(p) for p in self.train],
            "held": {k: [list(p) for p in v] for k, v in self.held.items()},
            "signs": dict(self.signs),
            "first_shares": self.first_shares,
            "length_corrs": list(self.length_corrs),
            "judge_pool": {k: [list(x) for x in v] for k, v in self.judge_pool.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train = [tuple(p) for p in state.get("train", [])]
        self.held = {k: [tuple(p) for p in v] for k, v in state.get("held", {}).items()}
        self.signs = dict(state.get("signs", {}))
        self.first_shares = state.get("first_shares")
        self.length_corrs.clear()
        self.length_corrs.extend(state.get("length_corrs", []))
        for key, pool in state.get("judge_pool", {}).items():
            if key in self.judge_pool:
                self.judge_pool[key].clear()
                self.judge_pool[key].extend(tuple(x) for x in pool)
