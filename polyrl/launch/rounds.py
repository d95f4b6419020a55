"""``until_resolved``: an experiment's seeds run in rounds, with a decision after each round.

Round r trains every arm on the round's seeds (seed-major: seed s of every arm, then s+1), then
reads each finished seed run's last value of every compared metric from MLflow and asks the
sequential rule (:mod:`polyrl.analysis.sequential`) for each comparison's verdict at this look.
A comparison keeps the first verdict that decides it; the experiment stops when every
comparison is decided, the seed budget is spent, or ``max_hours`` of training have passed.

The decisions live in ``experiment.json`` (``sequential``: one entry per round) and on the
MLflow parent run (a tag per round and ``sequential/decisions.json``), so an interrupted run
resumes the same sequence: the rounds already trained are read back, not rerun, and every
decision is recomputed from the runs themselves (never counted twice).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from polyrl.analysis.experiment_runs import finished_seed_runs, seed_finals
from polyrl.analysis.sequential import SequentialDecision, SequentialPlan, history
from polyrl.config.base import ConfigError
from polyrl.config.until_resolved import UntilResolvedConfig
from polyrl.core.errors import PolyrlError
from polyrl.launch.run_units import RunUnit

__all__ = ["RoundOutcome", "decide_round", "order_in_rounds", "sequential_plan"]


def sequential_plan(config: UntilResolvedConfig) -> SequentialPlan:
    return SequentialPlan(
        max_seeds=config.max_seeds,
        seeds_per_round=config.seeds_per_round,
        alpha=config.alpha,
        spending=config.spending,
        comparisons=len(config.comparisons),
    )


# On a seed run started ahead of the decision that then ended the sequence (side by side,
# polyrl.launch.side_by_side): it is not part of the sequence. A resume that trains it on as a
# round of the sequence removes the tag.
OUTSIDE_SEQUENCE_TAG = "polyrl.sequence.outside"


def order_in_rounds(units: list[RunUnit], config: UntilResolvedConfig) -> list[list[RunUnit]]:
    """The units of each round, seed-major inside a round (every arm's seed s, then s + 1), so
    that a round ends with both sides of each pair trained."""
    by_seed: dict[int, list[RunUnit]] = {}
    for unit in units:
        by_seed.setdefault(int(unit.seed), []).append(unit)  # type: ignore[arg-type]
    return [[unit for seed in seeds for unit in by_seed.get(seed, [])] for seeds in config.rounds()]


@dataclass
class RoundOutcome:
    """Where the sequence stands after a round: each comparison's latest decision (its first
    deciding look, or the latest undecided one) and the sentence that says it."""

    seeds: int
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        return bool(self.decisions) and all(d["verdict"] != "undecided" for d in self.decisions.values())

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class SequenceStalled(PolyrlError):
    """A round cannot be decided: a seed run of a compared arm failed or did not log the metric."""


def trained_finals(
    client, state: dict[str, Any], arms: list[str], metrics: list[str]
) -> tuple[dict[str, dict[str, dict[int, float]]], list[str]]:
    """metric -> arm -> seed -> the seed run's last value, over the seed runs this experiment
    trained to the end (``experiment.json``) that count; and
    one line per seed run left out (failed, stopped early)."""
    seed_runs: dict[str, dict[int, str]] = {arm: {} for arm in arms}
    for key, run_id in state.get("runs", {}).items():
        arm, _, seed = key.partition("/seed_")
        if arm in seed_runs and key in state.get("finished", []):
            seed_runs[arm][int(seed)] = run_id
    kept, left_out = finished_seed_runs(client, seed_runs)
    finals = seed_finals(client, kept, metrics)
    return finals, left_out


def decide_round(client, state: dict[str, Any], config: UntilResolvedConfig, seeds_so_far: list[int]) -> RoundOutcome:
    """Each comparison's decision over the seeds of the rounds trained so far."""
    arms = sorted({arm for comparison in config.comparisons for arm in comparison.arms})
    metrics = sorted({comparison.metric for comparison in config.comparisons})
    finals, left_out = trained_finals(client, state, arms, metrics)
    plan = sequential_plan(config)
    outcome = RoundOutcome(seeds=len(seeds_so_far), missing=left_out)
    for comparison in config.comparisons:
        a, b = comparison.arms
        values = finals[comparison.metric]
        absent = [f"{arm} seed {seed}" for arm in (a, b) for seed in seeds_so_far if seed not in values[arm]]
        if absent:
            logged = sorted(metrics)
            raise SequenceStalled(
                f"until_resolved: {comparison.name} cannot be decided after {len(seeds_so_far)} seeds: no final "
                f"{comparison.metric!r} for {', '.join(absent)}"
                + (
                    f" ({'; '.join(left_out)})"
                    if left_out
                    else f" (the compared metrics: {', '.join(logged)}; is the name right?)"
                )
                + ". Fix the cause and continue with --resume: the sequence goes on from the rounds trained."
            )
        differences = [values[a][seed] - values[b][seed] for seed in seeds_so_far]
        looks = history(differences, plan, comparison.sesoi)
        if not looks:
            outcome.sentences.append(f"{comparison.metric}: {a} vs {b}: no look yet ({len(seeds_so_far)} seed; a look needs 2)")
            outcome.decisions[comparison.name] = {"verdict": "undecided", "n": len(seeds_so_far), "look": None}
            continue
        latest: SequentialDecision = looks[-1]
        outcome.decisions[comparison.name] = asdict(latest) | {
            "arms": [a, b],
            "metric": comparison.metric,
            "higher_is_better": comparison.higher_is_better,
            "differences": differences[: latest.n],
        }
        outcome.sentences.append(latest.describe(comparison.metric, a, b, comparison.higher_is_better))
    return outcome


def record_round(state: dict[str, Any], parent_logger, outcome: RoundOutcome, elapsed_s: float) -> None:
    """The round's decisions into ``experiment.json`` and onto the MLflow parent run (a tag per
    round, per-comparison metrics at step = seeds so far, and the whole sequence as JSON)."""
    rounds = [r for r in state.setdefault("sequential", []) if r["seeds"] != outcome.seeds]
    rounds.append(outcome.as_json() | {"elapsed_s": round(elapsed_s, 1)})
    state["sequential"] = sorted(rounds, key=lambda r: r["seeds"])
    if parent_logger is None:
        return
    parent_logger.set_tags({f"polyrl.sequential.seeds_{outcome.seeds:03d}": " ".join(outcome.sentences)[:4900]})
    metrics: dict[str, float] = {}
    for index, decision in enumerate(outcome.decisions.values()):
        if decision.get("look") is None and "mean" not in decision:
            continue
        for part in ("mean", "low", "high"):
            metrics[f"sequential/c{index}/{part}"] = float(decision[part])
        metrics[f"sequential/c{index}/decided"] = float(decision["verdict"] != "undecided")
    if metrics:
        parent_logger.log_step(outcome.seeds, metrics)
    parent_logger.log_text(json.dumps(state["sequential"], indent=1), "sequential/decisions.json")


# What the guarantee needs fixed before the first seed; max_hours may change on a resume (it
# only decides whether another round starts, never a verdict).
FIXED_FIELDS = ("comparisons", "max_seeds", "seeds_per_round", "first_seed", "alpha", "spending")


def fixed_plan(config: UntilResolvedConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", include=set(FIXED_FIELDS))


def check_fixed_plan(recorded: dict[str, Any] | None, config: UntilResolvedConfig, source: str) -> None:
    """A resume must keep the plan its first round ran under: a changed SESOI, budget, α or
    comparison after looking at the data voids the error rate the rule promises."""
    if recorded is None:
        return
    now = fixed_plan(config)
    changed = [name for name in FIXED_FIELDS if recorded.get(name) != now.get(name)]
    if changed:
        shown = "; ".join(f"until_resolved.{name}: was {recorded.get(name)!r}, now {now.get(name)!r}" for name in changed)
        raise ConfigError(
            f"{source}: --resume with a changed plan ({shown}). The stopping rule's error rate holds only for a plan "
            "fixed before the first seed: restore these values, or start a new experiment (another name) with the new plan"
        )


class TrainingClock:
    """Training time across processes: what earlier runs of this experiment spent (from
    ``experiment.json``) plus this process's."""

    def __init__(self, state: dict[str, Any]):
        self.before = float(state.get("sequential_elapsed_s", 0.0))
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return self.before + time.monotonic() - self.started

    def save(self, state: dict[str, Any]) -> None:
        state["sequential_elapsed_s"] = round(self.elapsed(), 1)
