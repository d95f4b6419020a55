"""Per-example comparison of two arms: which held-out examples each arm solves, and intervals
that use the pairing by example within a seed together with the pairing by seed.

The rows are those every evaluation writes (``eval_examples/<suite>/step_<n>.jsonl``,
:mod:`polyrl.evals.example_outcomes`): one per completion, with its example id, arm, seed, step
and whether it was correct. Here they become :data:`Outcomes` — per arm, seed and example, the
share of the example's completions that were correct (with one completion per prompt: 1 or 0).

Two questions, two intervals (never confuse them):

- **Does the recipe differ?** The training seed is the replication unit: a new seed is a new
  trained checkpoint, a new example only measures the same checkpoint more precisely.
  :func:`hierarchical_interval` resamples seeds, then examples within each resampled seed
  (the two-stage bootstrap of Davison & Hinkley 1997, "Bootstrap Methods and their
  Application", §3.8), on the paired per-example differences. Its spread comes from the seeds;
  the example level only carries the evaluation noise, it never adds replications. With two
  stages the evaluation noise is counted twice (once inside each seed's value, once by the
  example resampling; D&H §3.8), so the interval errs wide; and a percentile interval of 3–5
  resampled seeds under-covers badly (3 values have 10 distinct resamples), so the interval is
  the bootstrap standard error times Student's t on S − 1 degrees of freedom. Both choices are
  measured in tests/analysis/test_per_example.py (the A/A simulations).
- **Do these trained checkpoints differ?** Per seed, examples are the sample:
  :func:`checkpoint_difference` (a paired bootstrap over examples, and McNemar's exact test
  on the discordant examples). A checkpoint difference at one seed says nothing about the
  recipe: two seeds of one recipe differ like that too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import stats as scipy_stats

from polyrl.analysis.stats import CONFIDENCE, Interval

# arm -> seed -> example id -> share of the example's completions that were correct
Outcomes = dict[str, dict[int, dict[str, float]]]
RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a fixed stream: the same rows give the same interval in every report


def final_step_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of each (arm, seed, dataset)'s last evaluated step."""
    rows = list(rows)
    last: dict[tuple, int] = {}
    for row in rows:
        key = (row["arm"], row["seed"], row["dataset"])
        last[key] = max(last.get(key, row["step"]), row["step"])
    return [row for row in rows if row["step"] == last[(row["arm"], row["seed"], row["dataset"])]]


def outcomes(rows: Iterable[Mapping[str, Any]], dataset: str) -> Outcomes:
    """Per arm, seed and example of ``dataset``: the share of its scored completions that were
    correct. Completions without a verdict (``correct`` None: no gold answer) are left out; an
    example with none scored is left out. The rows should be one step per (arm, seed)
    (:func:`final_step_rows`); several steps would be pooled."""
    counts: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        if row["dataset"] != dataset or row.get("correct") is None:
            continue
        count = counts[(row["arm"], int(row["seed"]), str(row["example_id"]))]
        count[0] += bool(row["correct"])
        count[1] += 1
    out: Outcomes = {}
    for (arm, seed, example), (correct, scored) in counts.items():
        out.setdefault(arm, {}).setdefault(seed, {})[example] = correct / scored
    return out


def prompt_snippets(rows: Iterable[Mapping[str, Any]], *, width: int = 80) -> dict[str, str]:
    """Example id -> the start of its prompt on one line (the report's examples)."""
    snippets: dict[str, str] = {}
    for row in rows:
        text = " ".join(str(row.get("prompt") or "").split())
        snippets.setdefault(str(row["example_id"]), text if len(text) <= width else text[: width - 1] + "…")
    return snippets


def solved(share: float) -> bool:
    """An example counts as solved by a checkpoint when more than half its completions were
    correct (with one completion per prompt: when it was correct)."""
    return share > 0.5


@dataclass(frozen=True)
class FlipCounts:
    """Examples both arms solve, only ``a``, only ``b``, neither (over the examples both saw)."""

    both: int = 0
    only_a: int = 0
    only_b: int = 0
    neither: int = 0

    @property
    def examples(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    def __add__(self, other: FlipCounts) -> FlipCounts:
        return FlipCounts(
            self.both + other.both, self.only_a + other.only_a, self.only_b + other.only_b, self.neither + other.neither
        )


def shared_seeds(data: Outcomes, a: str, b: str) -> list[int]:
    return sorted(set(data.get(a, {})) & set(data.get(b, {})))


def shared_examples(data: Outcomes, a: str, b: str, seed: int) -> list[str]:
    return sorted(set(data[a][seed]) & set(data[b][seed]))


def flip_table(data: Outcomes, a: str, b: str) -> tuple[dict[int, FlipCounts], FlipCounts]:
    """Per seed both arms ran, the :class:`FlipCounts` over the examples both evaluated there,
    and their sum over seeds (the pooled counts: an example counts once per seed)."""
    per_seed: dict[int, FlipCounts] = {}
    for seed in shared_seeds(data, a, b):
        cells = [0, 0, 0, 0]
        for example in shared_examples(data, a, b, seed):
            by_a, by_b = solved(data[a][seed][example]), solved(data[b][seed][example])
            if by_a and by_b:
                cells[0] += 1
            elif by_a:
                cells[1] += 1
            elif by_b:
                cells[2] += 1
            else:
                cells[3] += 1
        per_seed[seed] = FlipCounts(*cells)
    return per_seed, sum(per_seed.values(), FlipCounts())


@dataclass(frozen=True)
class FlippedExample:
    example_id: str
    seeds: int  # seeds at which this arm solved it and the other did not
    of: int  # seeds at which both arms evaluated it


def top_flips(data: Outcomes, a: str, b: str, *, most: int = 5) -> tuple[list[FlippedExample], list[FlippedExample]]:
    """The examples ``a`` solves and ``b`` does not (what ``a`` fixed relative to ``b``), and
    those ``b`` solves and ``a`` does not (what ``a`` broke), each ranked by at how many seeds,
    then by example id."""
    fixed: dict[str, int] = defaultdict(int)
    broke: dict[str, int] = defaultdict(int)
    seen: dict[str, int] = defaultdict(int)
    for seed in shared_seeds(data, a, b):
        for example in shared_examples(data, a, b, seed):
            seen[example] += 1
            by_a, by_b = solved(data[a][seed][example]), solved(data[b][seed][example])
            if by_a and not by_b:
                fixed[example] += 1
            elif by_b and not by_a:
                broke[example] += 1

    def ranked(counts: dict[str, int]) -> list[FlippedExample]:
        order = sorted(counts, key=lambda example: (-counts[example], example))[:most]
        return [FlippedExample(example, counts[example], seen[example]) for example in order]

    return ranked(fixed), ranked(broke)


def paired_differences(data: Outcomes, a: str, b: str) -> dict[int, np.ndarray]:
    """Per seed both arms ran: ``a``'s score minus ``b``'s on each example both evaluated there
    (in example-id order)."""
    out = {}
    for seed in shared_seeds(data, a, b):
        examples = shared_examples(data, a, b, seed)
        if examples:
            out[seed] = np.array([data[a][seed][e] - data[b][seed][e] for e in examples], dtype=np.float64)
    return out


def hierarchical_interval(
    differences: Mapping[int, np.ndarray],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """The recipe-level interval of the mean per-seed difference (the mean over seeds of each
    seed's mean paired difference), from a two-stage bootstrap: draw S seeds with replacement,
    then for each drawn seed its examples with replacement (a seed drawn twice gets two example
    draws).

    Drawing both stages counts the evaluation noise twice: each seed's mean already holds it,
    and the example stage adds it again. So, before drawing, each seed's differences are shifted
    so that its mean moves toward the grand mean by the factor
    c = √max(0, 1 − w/b), b the variance of the seed means and w the mean evaluation variance of
    a seed mean (var of its differences / its examples): the seed stage then carries only the
    between-seed spread beyond the evaluation noise, and the example stage the noise, once
    (Davison & Hinkley 1997, "Bootstrap Methods and their Application", §3.8, the shrunken
    two-stage bootstrap). The interval is the estimate ± Student's t on S − 1 degrees of freedom
    times the bootstrap standard error (scaled by √(S/(S−1)): the seed stage's plug-in variance
    divides by S), not the percentiles: 3 resampled seeds have 10 distinct draws, and a
    percentile interval under-covers. ``n`` of the interval is the number of seeds, the
    replications. Fewer than two seeds: no interval."""
    seeds = sorted(differences)
    per_seed = [np.asarray(differences[s], dtype=np.float64) for s in seeds]
    count = len(per_seed)
    if count == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    seed_means = np.array([values.mean() for values in per_seed])
    estimate = float(seed_means.mean())
    if count < 2:
        return Interval(estimate, math.nan, math.nan, count)
    between = float(seed_means.var(ddof=1))
    noise = float(np.mean([values.var(ddof=1) / len(values) if len(values) > 1 else 0.0 for values in per_seed]))
    shrink = math.sqrt(max(0.0, 1.0 - noise / between)) if between > 0 else 0.0
    shifted = [values + (estimate + shrink * (mean - estimate) - mean) for values, mean in zip(per_seed, seed_means)]
    rng = np.random.default_rng(seed)
    drawn_seeds = rng.integers(0, count, size=(resamples, count))
    slot_means = np.empty((resamples, count))
    for index, values in enumerate(shifted):  # each slot that drew this seed gets its own example draw
        chosen = drawn_seeds == index
        slot_means[chosen] = _draw_means(values, (int(chosen.sum()),), rng)
    replicate = slot_means.mean(axis=1)
    standard_error = float(replicate.std(ddof=1)) * math.sqrt(count / (count - 1))
    if standard_error == 0.0:
        return Interval(estimate, estimate, estimate, count)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, count - 1)) * standard_error
    return Interval(estimate, estimate - half, estimate + half, count)


def _draw_means(values: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Means of ``shape`` draws of len(values) values with replacement, through the counts of
    each distinct value (a multinomial draw: the same distribution as drawing indices, and
    small when the values take few levels, as differences of 0/1 outcomes do)."""
    levels, counts = np.unique(values, return_counts=True)
    drawn = rng.multinomial(len(values), counts / len(values), size=shape)
    return drawn @ levels / len(values)


@dataclass(frozen=True)
class CheckpointDifference:
    """One seed's two checkpoints: mean paired difference over the examples with its percentile
    bootstrap interval (``n``: examples), and McNemar's exact p on the discordant examples."""

    interval: Interval
    mcnemar_p: float


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar test: under "the checkpoints are equally good" each discordant
    example is equally likely to favour either, so ``only_a`` ~ Binomial(only_a + only_b, ½)."""
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0
    return float(scipy_stats.binomtest(only_a, discordant, 0.5).pvalue)


def checkpoint_difference(
    values: np.ndarray,
    counts: FlipCounts,
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> CheckpointDifference:
    """The difference between one seed's two checkpoints, examples as the sample."""
    values = np.asarray(values, dtype=np.float64)
    estimate = float(values.mean()) if len(values) else math.nan
    if len(values) < 2:
        return CheckpointDifference(Interval(estimate, math.nan, math.nan, len(values)), math.nan)
    rng = np.random.default_rng(seed)
    replicate = _draw_means(values, (resamples,), rng)
    low, high = np.quantile(replicate, [0.5 - confidence / 2, 0.5 + confidence / 2])
    return CheckpointDifference(
        Interval(estimate, float(low), float(high), len(values)), mcnemar_exact_p(counts.only_a, counts.only_b)
    )
