"""Counterfactual reward replay: a run's stored groups re-scored under other rewards, weights or
reward aggregation, and how their advantages would have moved. No policy is loaded.

The run's store (:mod:`polyrl.tracking.replay_store`) holds each group's prompt, completions and
every reward's raw score. :func:`replay` re-scores them under a candidate (a ``rewards:`` list,
optionally ``advantage.reward_aggregation``), computes each sample's advantage under the run's
setting and the candidate's with the run's estimator, and compares them step by step:

- ``sign_change_share``: share of the samples scored under both whose advantage changes sign
  (positive to negative or back), counted in the groups that neither setting leaves uniform (a
  uniform group has no signal, whatever the sign of its rounding: those are the groups below);
- ``spearman_mean``: Spearman's rank correlation of the old and new advantages within a group,
  averaged over the groups both settings separate (``spearman_groups`` of them);
- ``became_uniform`` / ``stopped_uniform``: groups whose advantages become all equal (0 for a group
  estimator: no signal) or stop being so;
- the samples whose advantage moves most (:attr:`ReplayReport.top`).

A candidate reward whose module, params, label and non-finite policy equal one of the run's is
not re-run: its stored scores are reused (only the weights change). Each step is scored as one
batch. Env episodes are re-scored as completions whose ``fields["episode"]`` holds the episode
(turns, return, verdict) and whose text is the last assistant turn. What replay cannot redo: the
KL in the reward (it needs the policy; left out of both sides, said in the notes), estimators with
a critic or a greedy baseline (refused), rewards that read images (not stored).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from scipy import stats as scipy_stats

from polyrl.algos.advantages import AdvantageInputs, get_advantage
from polyrl.algos.advantages.gdpo import gdpo_advantages
from polyrl.algos.dapo_data import dapo_overlong_penalty
from polyrl.algos.objectives import get_objective
from polyrl.config.base import ConfigError
from polyrl.config.schema import ExperimentConfig, resolve_arms
from polyrl.rewards import CompositeReward, RewardBatch, RewardSpec
from polyrl.rewards.base import module_label

TOLERANCE = 1e-6  # |advantage| at or below it counts as 0 (float rounding of a centred group)
CANDIDATE_KEYS = {"rewards": None, "advantage": {"reward_aggregation"}}


class ReplayError(ConfigError):
    """A replay that cannot run; the message says why and what would."""


@dataclass(frozen=True)
class Setting:
    """How rewards become advantages in one side of the comparison."""

    weights: dict[str, float]  # label -> weight, in the order of rewards[]
    specs: dict[str, RewardSpec]  # label -> its spec (empty for an episode run's stored "env" return)
    aggregation: str
    estimator: str
    params: dict[str, Any]
    overlong: Any  # OverlongConfig
    max_tokens: int

    @staticmethod
    def of(cfg: ExperimentConfig, labels: Sequence[str]) -> "Setting":
        """``cfg``'s setting with ``labels``, one per ``rewards[]`` entry (an episode run: ``["env"]``, its return)."""
        estimator = get_advantage(cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage)
        missing = {"values", "baselines"} & set(estimator.requires)
        if missing:
            raise ReplayError(
                f"the advantage estimator {estimator.name!r} needs {', '.join(sorted(missing))} (a critic or a greedy "
                "completion), which replay does not have: it loads no policy; replay runs with a group estimator"
            )
        specs = {} if cfg.env is not None else dict(zip(labels, cfg.rewards))
        return Setting(
            weights={"env": 1.0} if cfg.env is not None else {label: spec.weight for label, spec in specs.items()},
            specs=specs,
            aggregation=cfg.advantage.reward_aggregation,
            estimator=estimator.name,
            params={**estimator.default_params, **cfg.advantage.params},
            overlong=cfg.advantage.overlong,
            max_tokens=cfg.rollout.max_tokens,
        )


def _same_module(a: RewardSpec, b: RewardSpec) -> bool:
    keys = {"module", "params", "name", "on_nonfinite"}
    return a.model_dump(include=keys) == b.model_dump(include=keys)


def candidate_labels(candidate: ExperimentConfig, run: Setting, base_dir: Path | None) -> list[str]:
    """A label per candidate reward: the run's where the module is the run's own (its scores are then
    reused), else its name or its module's registered name (as the trainer labels it)."""
    labels = []
    for spec in candidate.rewards:
        same = [label for label, run_spec in run.specs.items() if _same_module(spec, run_spec)]
        labels.append(same[0] if same else spec.name or module_label(spec.resolve(base_dir=base_dir)))
    return labels


def candidate_config(run_config: dict[str, Any], candidate: Any, *, source: str) -> ExperimentConfig:
    """The run's resolved config with the candidate's ``rewards:`` (and ``advantage.reward_aggregation``,
    else the run's), validated as an experiment is: a bad reward spec or a refused aggregation is
    named by its field path. An episode run's ``env:`` is dropped (its stored episodes are scored
    by the candidate's rewards instead of their return)."""
    if not isinstance(candidate, dict) or "rewards" not in candidate:
        raise ReplayError(
            f"{source}: expected a mapping with a rewards: list (as an experiment's), and optionally advantage.reward_aggregation"
        )
    for key, value in candidate.items():
        if key not in CANDIDATE_KEYS:
            raise ReplayError(f"{source}: {key}: not a replay setting; allowed: rewards, advantage.reward_aggregation")
        allowed = CANDIDATE_KEYS[key]
        if allowed is not None and (not isinstance(value, dict) or set(value) - allowed):
            extra = sorted(set(value) - allowed) if isinstance(value, dict) else value
            raise ReplayError(f"{source}: advantage: {extra} not a replay setting; allowed: advantage.reward_aggregation")
    raw = copy.deepcopy(run_config)
    raw.pop("env", None)
    raw["rewards"] = candidate["rewards"]
    if "advantage" in candidate:
        raw.setdefault("advantage", {})["reward_aggregation"] = candidate["advantage"]["reward_aggregation"]
    return resolve_arms(raw, source=source)["main"]


# --- advantages -------------------------------------------------------------------------------------


def sample_advantages(
    scores: Mapping[str, Sequence[float | None]], setting: Setting, group_ids: torch.Tensor, lengths: Sequence[int]
) -> torch.Tensor:
    """Each sample's advantage [N] (its mean over its response tokens; NaN where unscored) under
    ``setting``, from each reward's raw scores, as the trainer's advantage stage computes it."""
    n = len(group_ids)
    width = max([1, *lengths])
    mask = torch.zeros(n, width)
    for row, length in enumerate(lengths):
        mask[row, : max(1, int(length))] = 1
    if setting.aggregation == "gdpo":
        advantages, _ = gdpo_advantages(scores, setting.weights, group_ids, mask, eps=setting.params.get("eps", 1e-6))
        unscored = torch.tensor([any(scores[label][i] is None for label in setting.weights) for i in range(n)])
    else:
        totals = [
            math.nan if any(scores[label][i] is None for label in setting.weights)
            else math.fsum(w * scores[label][i] for label, w in setting.weights.items())
            for i in range(n)
        ]  # fmt: skip
        rewards = torch.tensor(totals, dtype=torch.float32)
        overlong = setting.overlong
        if overlong.mode == "soft_punishment":
            penalty = dapo_overlong_penalty(
                torch.tensor(list(lengths)),
                max_length=overlong.max_length or setting.max_tokens,
                cache_length=overlong.cache_length,
            )
            rewards = rewards + overlong.penalty_weight * penalty.to(rewards.dtype)
        advantages, _ = get_advantage(setting.estimator).fn(AdvantageInputs(rewards, mask, group_ids), **setting.params)
        unscored = torch.isnan(rewards)
    per_sample = (advantages * mask).sum(-1) / mask.sum(-1)
    return torch.where(unscored, torch.full_like(per_sample, math.nan), per_sample)


def _uniform(values: torch.Tensor) -> bool:
    """All the group's advantages equal (no signal within it; 0 for a group estimator)."""
    return bool(values.numel()) and float(values.max() - values.min()) <= TOLERANCE


def compare_step(old: torch.Tensor, new: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """The comparison of one step's advantages (module docstring): counts, so steps can be pooled."""
    both = ~torch.isnan(old) & ~torch.isnan(new)
    flips = ((old > TOLERANCE) & (new < -TOLERANCE)) | ((old < -TOLERANCE) & (new > TOLERANCE))
    out = {"samples": float(both.sum()), "sign_changes": 0.0, "groups": 0.0, "became_uniform": 0.0,
           "stopped_uniform": 0.0, "spearman_groups": 0.0, "spearman_sum": 0.0}  # fmt: skip
    for group in torch.unique(group_ids):
        rows = (group_ids == group) & both
        if not rows.any():
            continue
        out["groups"] += 1
        a, b = old[rows], new[rows]
        was, now = _uniform(a), _uniform(b)
        out["became_uniform"] += float(now and not was)
        out["stopped_uniform"] += float(was and not now)
        if was or now:  # a uniform group's advantages carry no sign (a group estimator's rounding at most)
            continue
        out["sign_changes"] += float(flips[rows].sum())
        if int(rows.sum()) > 1:
            out["spearman_groups"] += 1
            out["spearman_sum"] += float(scipy_stats.spearmanr(a.numpy(), b.numpy()).statistic)  # average ranks on ties
    return out


def summarise(counts: dict[str, float]) -> dict[str, float]:
    """Shares and means from pooled :func:`compare_step` counts."""
    return {
        "samples": counts["samples"],
        "groups": counts["groups"],
        "sign_change_share": counts["sign_changes"] / counts["samples"] if counts["samples"] else math.nan,
        "spearman_mean": counts["spearman_sum"] / counts["spearman_groups"] if counts["spearman_groups"] else math.nan,
        "spearman_groups": counts["spearman_groups"],
        "became_uniform": counts["became_uniform"],
        "stopped_uniform": counts["stopped_uniform"],
    }


# --- the replay -------------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    steps: dict[int, dict[str, float]]  # step -> summarise(...) of that step
    overall: dict[str, float]
    top: list[dict[str, Any]]  # the samples whose advantage moved most
    reused: list[str]  # candidate rewards whose stored scores were reused
    rescored: list[str]  # candidate rewards run again on the stored completions
    score_seconds: float  # wall time of the re-scoring
    notes: list[str] = field(default_factory=list)
    # The whole group of each top sample, in the order of ``top`` (each mover's "page_group" is its
    # index here): its prompt and every sample's text, length, advantages and scores, before and
    # after. polyrl/analysis/replay_page.py draws them as a rollout-inspector page.
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seconds_per_1000(self) -> float:
        samples = self.overall["samples"]
        return 1000 * self.score_seconds / samples if samples else math.nan


def _flat(record: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], torch.Tensor]:
    """``(samples, their groups, group ids [N])`` of one stored step, prompt-major."""
    samples, groups, ids = [], [], []
    for group in record["groups"]:
        for sample in group["samples"]:
            samples.append(sample)
            groups.append(group)
            ids.append(group["g"])
    return samples, groups, torch.tensor(ids, dtype=torch.long)


def _batch(samples: list[dict[str, Any]], groups: list[dict[str, Any]]) -> RewardBatch:
    return RewardBatch(
        prompts=[g["prompt"] for g in groups],
        completions=[s["text"] for s in samples],
        references=[list(g["refs"]) for g in groups],
        fields=[{**g["fields"], **({"episode": s["episode"]} if "episode" in s else {})} for s, g in zip(samples, groups)],
    )


def replay(
    header: dict[str, Any],
    records: Mapping[int, dict[str, Any]],
    candidate: Any,
    *,
    source: str = "<candidate>",
    base_dir: Path | None = None,
    top: int = 5,
) -> ReplayReport:
    """Re-score the stored ``records`` (``{step: record}`` of :func:`polyrl.tracking.replay_store.read_store`)
    under ``candidate`` (the parsed YAML) and compare the advantages with the run's."""
    run_cfg = resolve_arms(copy.deepcopy(header["config"]), source="the run's stored config")["main"]
    old = Setting.of(run_cfg, list(header["weights"]))  # the trainer's labels, in rewards[] order
    candidate_cfg = candidate_config(header["config"], candidate, source=source)
    new = Setting.of(candidate_cfg, candidate_labels(candidate_cfg, old, base_dir))
    if len(new.weights) != len(candidate_cfg.rewards):
        raise ReplayError(f"{source}: two rewards share a label; give one of them a distinct name")
    reused = {label: label for label, spec in new.specs.items() if label in old.specs and _same_module(spec, old.specs[label])}
    rescored = [label for label in new.specs if label not in reused]
    notes = []
    if run_cfg.train.kl_in_reward:
        notes.append("train.kl_in_reward: the KL penalty needs the policy; both sides are computed without it")
    if any(g["images"] for r in records.values() for g in r["groups"]):
        notes.append("some prompts had images, which the store does not keep: rewards reading images see none")
    scorer = CompositeReward([new.specs[label] for label in rescored], base_dir=base_dir) if rescored else None
    steps, pooled, moved, seconds = {}, None, [], 0.0
    kept: dict[int, tuple[list, list, torch.Tensor, torch.Tensor, torch.Tensor, dict, dict]] = {}
    try:
        for step, record in records.items():
            samples, groups, group_ids = _flat(record)
            if not samples:
                continue
            stored = {label: [s["scores"].get(label) for s in samples] for label in old.weights}
            scores = {label: stored[run_label] for label, run_label in reused.items()}
            if scorer is not None:
                started = time.perf_counter()
                scores.update(scorer.score(_batch(samples, groups)).per_module)
                seconds += time.perf_counter() - started
            lengths = [int(s["n"] if s["n"] is not None else len(s["ids"])) for s in samples]
            before = sample_advantages(stored, old, group_ids, lengths)
            after = sample_advantages({label: scores[label] for label in new.weights}, new, group_ids, lengths)
            kept[step] = (samples, groups, group_ids, before, after, stored, scores)
            counts = compare_step(before, after, group_ids)
            steps[step] = summarise(counts)
            pooled = counts if pooled is None else {k: pooled[k] + v for k, v in counts.items()}
            for i in torch.nonzero(~torch.isnan(before) & ~torch.isnan(after)).flatten().tolist():
                moved.append({"step": step, "group": int(group_ids[i]), "text": samples[i]["text"],
                              "old_advantage": float(before[i]), "new_advantage": float(after[i]),
                              "old_scores": {k: stored[k][i] for k in stored}, "new_scores": {k: scores[k][i] for k in new.weights}})  # fmt: skip
            moved = sorted(moved, key=lambda m: abs(m["new_advantage"] - m["old_advantage"]), reverse=True)[:top]
    finally:
        if scorer is not None:
            scorer.close()
    if pooled is None:
        raise ReplayError("the store holds no step in the range asked for")
    shown = _mover_groups(moved, kept, new.weights)
    return ReplayReport(steps, summarise(pooled), moved, sorted(reused), rescored, seconds, notes, shown)


def _mover_groups(moved: list[dict[str, Any]], kept: Mapping[int, tuple], labels: Mapping[str, float]) -> list[dict[str, Any]]:
    """The groups of the top samples (one entry per (step, group), first mover first); each mover
    gets its group's index as ``page_group``."""
    index: dict[tuple[int, int], int] = {}
    out: list[dict[str, Any]] = []
    for mover in moved:
        key = (mover["step"], mover["group"])
        if key not in index:
            samples, groups, group_ids, before, after, stored, scores = kept[mover["step"]]
            members = [i for i in range(len(samples)) if int(group_ids[i]) == mover["group"]]
            index[key] = len(out)
            out.append(
                {"step": key[0], "group": key[1], "prompt": groups[members[0]]["prompt"],
                 "samples": [{"text": samples[i]["text"], "n": samples[i]["n"], "finish": samples[i].get("finish"),
                              "old_advantage": _plain(before[i]), "new_advantage": _plain(after[i]),
                              "old_scores": {k: stored[k][i] for k in stored},
                              "new_scores": {k: scores[k][i] for k in labels}} for i in members]}
            )  # fmt: skip
        mover["page_group"] = index[key]
    return out


def _plain(value: torch.Tensor) -> float | None:
    """A tensor element as a float; None where it is NaN (a sample the estimator leaves unscored)."""
    number = float(value)
    return None if math.isnan(number) else number


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """``a:b`` (both ends included), ``a:``, ``:b`` or ``a`` → ``(first, last)``; None: open."""
    if not text:
        return None, None
    try:
        if ":" not in text:
            return int(text), int(text)
        first, last = text.split(":", 1)
        return (int(first) if first else None), (int(last) if last else None)
    except ValueError:
        raise ReplayError(f"--steps {text!r}: expected a:b (both included), a:, :b or one step number") from None


def select_steps(records: Mapping[int, dict[str, Any]], first: int | None, last: int | None) -> dict[int, dict[str, Any]]:
    return {s: r for s, r in records.items() if (first is None or s >= first) and (last is None or s <= last)}
