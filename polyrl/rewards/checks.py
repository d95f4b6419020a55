"""Contract checks for one reward module on real rows (used by ``polyrl rewards check``).

Each check is PASS, WARN or FAIL with a message; a report fails when any check fails.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any

from polyrl.rewards.base import RewardBatch
from polyrl.rewards.composite import DEFAULT_TIMEOUT_S, RewardStopped, locate_failing_sample, timed_score
from polyrl.rewards.summary import SCORE_LIMIT, mean_and_std

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass
class CheckResult:
    name: str
    status: str
    message: str


@dataclass
class CheckReport:
    label: str
    samples: int
    results: list[CheckResult] = field(default_factory=list)
    scores: list[Any] = field(default_factory=list)
    samples_per_second: float | None = None

    @property
    def ok(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def add(self, name: str, status: str, message: str) -> None:
        self.results.append(CheckResult(name, status, message))

    def summary(self) -> dict[str, float]:
        scored = [float(v) for v in self.scores if _is_number(v) and math.isfinite(float(v))]
        out = {"samples": float(self.samples), "scored": float(len(scored))}
        if scored:
            mean, std = mean_and_std(scored)
            out.update(mean=mean, std=std, min=min(scored), max=max(scored))
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _same(a: Any, b: Any, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    if not (_is_number(a) and _is_number(b)):
        return a == b
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def check_module(
    module: Any,
    batch: RewardBatch,
    *,
    label: str,
    tolerance: float = 1e-6,
    independence_samples: int = 8,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> CheckReport:
    """Run ``module`` on ``batch`` and check the reward contract.

    Checks: setup runs; score runs (on failure, the first sample that fails alone is named);
    the result is a list of len(batch) floats/None; no NaN/inf; two calls agree (within
    ``tolerance``); and (WARN only) the first ``independence_samples`` samples score the same
    alone as in the batch. Also measures samples/s of the first call. Each score call has
    ``timeout_s`` seconds (training's default budget per batch); past it the check fails and stops.
    """
    report = CheckReport(label=label, samples=len(batch))
    setup = getattr(module, "setup", None)
    if setup is not None:
        try:
            setup()
        except Exception as error:  # noqa: BLE001
            report.add("setup", FAIL, f"{label}: setup raised {type(error).__name__}: {error}")
            return report

    def score(part: RewardBatch) -> Any:
        return timed_score(module, part, label=label, timeout_s=timeout_s)

    start = time.perf_counter()
    try:
        first = score(batch)
    except RewardStopped as error:
        report.add("exceptions", FAIL, str(error))
        return report
    except Exception as error:  # noqa: BLE001
        try:
            index, sample_error = locate_failing_sample(module, batch, label=label, timeout_s=timeout_s)
        except RewardStopped as stopped:
            report.add("exceptions", FAIL, str(stopped))
            return report
        if index is None:
            report.add(
                "exceptions", FAIL, f"{label}: raised {type(error).__name__}: {error} on the batch; no single sample fails alone"
            )
        else:
            report.add(
                "exceptions",
                FAIL,
                f"{label}: raised {type(sample_error).__name__}: {sample_error} on {batch.sample(index)}",
            )
        return report
    elapsed = time.perf_counter() - start
    report.samples_per_second = len(batch) / elapsed if elapsed > 0 else float("inf")
    report.add("exceptions", PASS, "no exception")

    if isinstance(first, (str, bytes, dict)) or not hasattr(first, "__len__"):
        report.add(
            "contract", FAIL, f"{label}: score returned {type(first).__name__}, expected a list of {len(batch)} floats/None"
        )
        return report
    first = list(first)
    report.scores = first
    problems = []
    if len(first) != len(batch):
        problems.append(f"returned {len(first)} scores for {len(batch)} samples")
    bad_types = [(i, v) for i, v in enumerate(first) if v is not None and not _is_number(v)]
    if bad_types:
        i, v = bad_types[0]
        problems.append(f"{len(bad_types)} score(s) are not float/None, first {v!r} ({type(v).__name__}) for {batch.sample(i)}")
    if problems:
        report.add("contract", FAIL, f"{label}: " + "; ".join(problems))
    else:
        unscored = sum(v is None for v in first)
        types = sorted({type(v).__name__ for v in first})
        report.add("contract", PASS, f"{len(first)} scores ({', '.join(types)}), {unscored} unscored")
        if first and unscored == len(first):
            report.add(
                "scored",
                WARN,
                f"{label}: returned None for all {len(first)} samples; a training run stops on such a batch "
                "unless the reward spec sets allow_unscored: true (do the rows have the fields it reads?)",
            )

    nonfinite = [i for i, v in enumerate(first) if _is_number(v) and not math.isfinite(float(v))]
    huge = [i for i, v in enumerate(first) if _is_number(v) and math.isfinite(float(v)) and abs(float(v)) > SCORE_LIMIT]
    if nonfinite:
        report.add(
            "finite",
            FAIL,
            f"{label}: {len(nonfinite)} NaN/inf score(s), first {first[nonfinite[0]]} for {batch.sample(nonfinite[0])}",
        )
    elif huge:
        report.add(
            "finite",
            FAIL,
            f"{label}: {len(huge)} score(s) beyond the float32 range (|score| <= {SCORE_LIMIT:.4g}) rewards are trained in, "
            f"first {float(first[huge[0]]):g} for {batch.sample(huge[0])}; training refuses them; rescale the score",
        )
    else:
        report.add("finite", PASS, "no NaN/inf")

    try:
        second = list(score(batch))
    except RewardStopped as error:
        report.add("deterministic", FAIL, str(error))
        return report
    except Exception as error:  # noqa: BLE001
        report.add("deterministic", FAIL, f"{label}: the second call raised {type(error).__name__}: {error}")
        return report
    differ = [i for i in range(min(len(first), len(second))) if not _same(first[i], second[i], tolerance)]
    if len(first) != len(second) or differ:
        where = f"; first at {batch.sample(differ[0])}: {first[differ[0]]!r} then {second[differ[0]]!r}" if differ else ""
        report.add("deterministic", FAIL, f"{label}: two calls on the same batch disagree on {len(differ)} sample(s){where}")
    else:
        report.add("deterministic", PASS, "two calls agree")

    if len(first) == len(batch) and len(batch) > 1:
        alone_differ = []
        for i in range(min(independence_samples, len(batch))):
            try:
                alone = list(score(batch.subset([i])))
            except RewardStopped as error:
                report.add("batch_independent", FAIL, str(error))
                return report
            except Exception as error:  # noqa: BLE001
                report.add(
                    "batch_independent", FAIL, f"{label}: raised {type(error).__name__}: {error} on {batch.sample(i)} alone"
                )
                return report
            if len(alone) != 1 or not _same(alone[0], first[i], max(tolerance, 1e-4)):
                alone_differ.append((i, alone[0] if alone else None))
        if alone_differ:
            i, value = alone_differ[0]
            report.add(
                "batch_independent",
                WARN,
                f"{len(alone_differ)} sample(s) score differently alone than in the batch, first {batch.sample(i)}: "
                f"{first[i]!r} in the batch, {value!r} alone",
            )
        else:
            report.add("batch_independent", PASS, f"first {min(independence_samples, len(batch))} samples score the same alone")
    return report
