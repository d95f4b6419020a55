"""Comparing arms at equal compute: ``polyrl compare --axis tokens|flops|seconds``.

Arms that do different work per step — DAPO's refill rounds, ReMax's greedy sample, an
asynchronous arm, another ``samples_per_prompt`` — are not compared fairly at equal steps: an
arm that samples twice the tokens per step looks better per step for that reason alone. Every
training step logs cumulative counters (:mod:`polyrl.trainer.compute_counters`); on another
axis than the step,

- curves are drawn against the counter: a point logged at step ``s`` sits at the run's counter
  at ``s`` (an eval metric logged at an eval step looks the counter up at that step; the step-0
  evaluation of the starting policy sits at 0, before any training step);
- the compared value of each run is taken at the *budget*, the largest counter value every
  compared run reached (the smallest of their final counters): the run's last logged point at
  or before it. Values are not interpolated between two logged points: a held-out score exists
  only where the policy was evaluated, and a line drawn between two evaluations is no
  measurement. A run thus shows the policy it had at the budget or a little before it (the
  report says at which step each run's value was taken);
- the paired-by-seed intervals, Holm's correction and the verdicts then run on those values
  unchanged, as do the curve summaries and the change over training (over each run's points
  up to the budget).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from mlflow.tracking import MlflowClient

from polyrl.analysis.report_metrics import SeedHistories, save_curve_plot
from polyrl.analysis.stats import CONFIDENCE, curve_band
from polyrl.core.errors import PolyrlError

Counter = dict[int, float]  # step -> the run's cumulative counter at that step
EXAMPLE_FILE = re.compile(r"step_(\d+)(\.polyrl-eval)?\.jsonl$")  # polyrl.analysis.example_runs.FILE_NAME, by path


@dataclass(frozen=True)
class Axis:
    name: str  # the --axis value
    counter: str | None  # the metric holding it (None: the step itself)
    label: str  # what a number on it counts, in words
    xlabel: str


# The counters' keys are those of polyrl.trainer.compute_counters (not imported: the trainer's
# import pulls in torch, and reading a store needs none of it).
AXES: dict[str, Axis] = {
    "step": Axis("step", None, "steps", "step"),
    "tokens": Axis("tokens", "compute/generated_tokens", "generated tokens", "generated tokens (cumulative)"),
    "flops": Axis("flops", "compute/learner_flops", "learner FLOPs", "learner FLOPs (cumulative, 6·N per trained token)"),
    "seconds": Axis("seconds", "compute/seconds", "seconds of training steps", "seconds of training steps (cumulative)"),
}


class AxisError(PolyrlError, ValueError):
    pass


def axis_named(name: str) -> Axis:
    """The axis ``--axis name`` names; an unknown name is refused with the allowed ones."""
    if name not in AXES:
        raise AxisError(f"--axis {name!r} is not an axis; allowed: {', '.join(AXES)}")
    return AXES[name]


def counter_history(client: MlflowClient, run_id: str, key: str) -> Counter:
    """The run's counter by step (a step logged twice, e.g. by a resumed run: its last value)."""
    return {int(m.step): float(m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}


def x_at(counter: Counter, step: int) -> float:
    """The counter at ``step``: its value there, else at the last step before it that logged one,
    else 0 (before the first training step, e.g. the step-0 evaluation of the starting policy)."""
    if step in counter:
        return counter[step]
    steps = sorted(counter)
    index = bisect.bisect_right(steps, step)
    return counter[steps[index - 1]] if index else 0.0


def run_label(arm: str, seed: Any) -> str:
    return arm if seed is None else f"{arm} seed {seed}"


@dataclass
class Budget:
    """The compared runs on one axis: each run's counter, and the largest value all reached."""

    axis: Axis
    value: float
    runs: dict[str, dict[Any, str]]  # arm -> seed (None: one run per arm) -> run id
    counters: dict[str, Counter]  # run id -> its counter

    def x(self, run_id: str, step: int) -> float:
        return x_at(self.counters[run_id], step)

    def heading(self) -> str:
        """``at 1.2e+06 generated tokens, the most every run reached``"""
        return f"at {self.value:.3g} {self.axis.label}, the most every run reached"

    def step_at_budget(self, run_id: str) -> int | None:
        """The run's last step whose counter is within the budget (None: not even its first)."""
        within = [step for step, x in self.counters[run_id].items() if x <= self.value]
        return max(within) if within else None

    def note(self) -> str:
        """How the compared values were taken, and the step each run's value comes from."""
        smallest = min(
            (
                (max(self.counters[run_id].values()), run_label(arm, seed))
                for arm, by in self.runs.items()
                for seed, run_id in by.items()
            ),
        )[1]
        reached = []
        for arm, by_seed in self.runs.items():
            cells = []
            for seed, run_id in sorted(by_seed.items(), key=lambda item: (item[0] is None, item[0])):
                at, last = self.step_at_budget(run_id), max(self.counters[run_id])
                cells.append(f"{'–' if at is None else at} of {last}" + ("" if seed is None else f" (seed {seed})"))
            reached.append(f"{arm}: {', '.join(cells)}")
        return (
            f"Compared at equal {self.axis.label} (`--axis {self.axis.name}`, metric `{self.axis.counter}`): each run's value "
            f"is its last logged point at or before {self.value:.4g} {self.axis.label}, the most every run reached "
            f"({smallest}'s final count); no interpolation between logged points (a held-out score is the last evaluation "
            f"within the budget); curve summaries and changes over training run over each run's points within it. "
            f"Last step within the budget, of the run's steps: {'; '.join(reached)}."
        )

    def limited(self, histories: SeedHistories) -> SeedHistories:
        """Each seed's points at or before the budget (still by step), so that a seed's last point
        is its value at the budget, and curve summaries and changes run over the same span."""
        return {
            arm: {
                key: {
                    seed: [(s, v) for s, v in points if self.x(self.runs[arm][seed], s) <= self.value]
                    for seed, points in by_seed.items()
                }
                for key, by_seed in by_key.items()
            }
            for arm, by_key in histories.items()
        }

    def plot(
        self, histories: SeedHistories, keys: list[str], titles: dict[str, str], *, experiment: str, out: Path, seeded: bool
    ) -> list[Path]:
        """One PNG per metric against the axis: per arm and step, the mean over seeds (shaded: its
        95% t-band when ``seeded``) drawn at the mean of the seeds' counters at that step; a dashed
        line marks the budget."""
        paths = []
        for key in keys:
            figure, axis = plt.subplots(figsize=(6, 3.6))
            drawn = False
            for arm, by_key in histories.items():
                runs = {seed: points for seed, points in by_key.get(key, {}).items() if points}
                if not runs:
                    continue
                xs: dict[int, list[float]] = {}
                for seed, points in runs.items():
                    for step, value in points:
                        if value == value:  # curve_band leaves NaN out; so does the mean position
                            xs.setdefault(int(step), []).append(self.x(self.runs[arm][seed], step))
                steps, mean, low, high = curve_band(list(runs.values()))
                position = [sum(xs[s]) / len(xs[s]) for s in steps]
                label = f"{arm} (n={len(runs)})" if seeded else arm
                (line,) = axis.plot(position, mean, marker="o", markersize=2.5, label=label)
                if seeded:
                    axis.fill_between(position, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
                drawn = True
            if not drawn:
                plt.close(figure)
                continue
            axis.axvline(self.value, color="grey", linestyle="--", linewidth=1, label="budget (most every run reached)")
            band = f"mean over seeds, shaded: {CONFIDENCE:.0%} CI" if seeded else "one run per arm"
            axis.set_title(f"{experiment}: {titles[key]}\n{band}; compared at the dashed line", fontsize=9)
            paths.append(save_curve_plot(figure, axis, out, key, legend_fontsize=8, xlabel=self.axis.xlabel))
        return paths

    def example_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of per-example rows of every evaluated step (``runs_example_rows(final_only=False)``),
        per run and suite those of its last evaluation within the budget (at one step, a
        ``polyrl eval`` file before the training loop's, as ``final_files`` picks)."""
        chosen: dict[tuple[str, str], tuple[int, bool, str]] = {}
        for row in rows:
            match = EXAMPLE_FILE.search(row["file"])
            if match is None or self.x(row["run_id"], int(match.group(1))) > self.value:
                continue
            rank = (int(match.group(1)), bool(match.group(2)), row["file"])
            place = (row["run_id"], row["suite"])
            if place not in chosen or rank > chosen[place]:
                chosen[place] = rank
        return [row for row in rows if chosen.get((row["run_id"], row["suite"]), (0, False, None))[2] == row["file"]]


def budget_for(client: MlflowClient, axis: Axis, runs: dict[str, dict[Any, str]]) -> Budget | None:
    """The compared runs' budget on ``axis`` (None on the step axis). Runs that did not log the
    axis' counter (runs from before polyrl logged them) are refused, naming the metric and them;
    so are runs whose counter never rose above 0 (the budget would be 0)."""
    if axis.counter is None:
        return None
    counters = {run_id: counter_history(client, run_id, axis.counter) for by_seed in runs.values() for run_id in by_seed.values()}
    labelled = [(run_label(arm, seed), run_id) for arm, by_seed in runs.items() for seed, run_id in by_seed.items()]
    missing = [f"{label} (run `{run_id}`)" for label, run_id in labelled if not counters[run_id]]
    if missing:
        raise AxisError(
            f"--axis {axis.name} compares runs at equal {axis.label}, read from the metric {axis.counter}, which "
            f"{len(missing)} of the {len(labelled)} compared runs did not log: {', '.join(missing)}. Runs from before polyrl "
            "logged cumulative compute (compute/generated_tokens, compute/learner_tokens, compute/learner_flops, "
            "compute/seconds) can be compared by step only (--axis step)."
        )
    if not labelled:
        return None
    idle = [f"{label} (run `{run_id}`)" for label, run_id in labelled if max(counters[run_id].values()) <= 0]
    if idle:
        raise AxisError(
            f"--axis {axis.name}: the metric {axis.counter} never rose above 0 in {', '.join(idle)}, so the most every run "
            "reached is 0 and there is nothing to compare; compare by another axis (--axis step)"
        )
    value = min(max(counter.values()) for counter in counters.values())
    return Budget(axis, value, runs, counters)
