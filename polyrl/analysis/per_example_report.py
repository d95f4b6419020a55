"""The per-example section of ``polyrl compare``'s report: for each compared pair of arms and
each held-out dataset, the flip table (per seed and pooled), the examples each arm fixed or
broke, the recipe-level interval (seeds, then examples within seeds) and, labelled as such, the
checkpoint-level one per seed. The maths is :mod:`polyrl.analysis.per_example`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from polyrl.analysis.per_example import (
    CheckpointDifference,
    FlipCounts,
    FlippedExample,
    checkpoint_difference,
    final_step_rows,
    flip_table,
    hierarchical_interval,
    outcomes,
    paired_differences,
    prompt_snippets,
    top_flips,
)
from polyrl.analysis.stats import CONFIDENCE, Interval

MOST_FLIPS = 5  # examples listed per direction


@dataclass
class PairExamples:
    """One pair of arms on one dataset, from the final evaluation of each seed."""

    dataset: str
    first: str
    second: str
    per_seed: dict[int, FlipCounts]
    pooled: FlipCounts
    recipe: Interval  # first − second, seeds as replications (hierarchical_interval)
    checkpoints: dict[int, CheckpointDifference]  # per seed: examples as the sample
    fixed: list[FlippedExample]  # first solves, second does not
    broke: list[FlippedExample]  # second solves, first does not


def pair_examples(rows: Sequence[Mapping[str, Any]], pairs: Sequence[tuple[str, str]]) -> list[PairExamples]:
    """Every (dataset, pair) with per-example verdicts (``correct``) for both arms at a seed they
    share. ``rows``: the runs' per-example rows (:mod:`polyrl.analysis.example_runs`); each
    (arm, seed, dataset)'s last step is used."""
    final = final_step_rows(rows)
    out = []
    for dataset in sorted({row["dataset"] for row in final}):
        data = outcomes(final, dataset)
        for first, second in pairs:
            per_seed, pooled = flip_table(data, first, second)
            if not per_seed or not pooled.examples:
                continue
            differences = paired_differences(data, first, second)
            fixed, broke = top_flips(data, first, second, most=MOST_FLIPS)
            out.append(
                PairExamples(
                    dataset,
                    first,
                    second,
                    per_seed,
                    pooled,
                    hierarchical_interval(differences),
                    {seed: checkpoint_difference(differences[seed], per_seed[seed]) for seed in differences},
                    fixed,
                    broke,
                )
            )
    return out


def _interval(interval: Interval) -> str:
    if interval.low != interval.low:
        return f"{interval.estimate:+.3g} (no interval)"
    return f"{interval.estimate:+.3g} [{interval.low:+.3g}, {interval.high:+.3g}]"


def recipe_said(pair: PairExamples) -> str:
    interval = pair.recipe
    if interval.low != interval.low:
        return f"one shared seed: no recipe-level interval (seeds are the replications; {pair.pooled.examples} examples are not)"
    if interval.contains(0.0):
        return f"not distinguishable at {interval.n} seeds (the interval contains 0)"
    better = pair.first if interval.estimate > 0 else pair.second
    return f"{better} higher (the interval excludes 0 at {interval.n} seeds)"


# (dataset, first arm, second arm) -> the flip page's path relative to the report, and each
# shown example's prompt group on it (polyrl.analysis.flip_pages).
FlipLinks = Mapping[tuple[str, str, str], tuple[str, Mapping[str, int]]]


def _flip_lines(pair: PairExamples, snippets: Mapping[str, str], links: FlipLinks | None = None) -> list[str]:
    a, b = pair.first, pair.second
    lines = [
        f"| seed | examples | both solve | only {a} | only {b} | neither | {a} − {b} (these checkpoints) | McNemar exact p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, counts in pair.per_seed.items():
        checkpoint = pair.checkpoints.get(seed)
        shown = _interval(checkpoint.interval) if checkpoint else "–"
        p = f"{checkpoint.mcnemar_p:.2g}" if checkpoint and checkpoint.mcnemar_p == checkpoint.mcnemar_p else "–"
        lines.append(
            f"| {seed} | {counts.examples} | {counts.both} | {counts.only_a} | {counts.only_b} | {counts.neither} | {shown} | {p} |"
        )
    total = pair.pooled
    lines.append(f"| pooled | {total.examples} | {total.both} | {total.only_a} | {total.only_b} | {total.neither} | | |")
    page, groups = (links or {}).get((pair.dataset, a, b), ("", {}))

    def link(example: str) -> str:
        return f" · [both arms' completions]({page}#group={groups[example]})" if example in groups else ""

    for title, flipped in ((f"{a} solves, {b} does not", pair.fixed), (f"{b} solves, {a} does not", pair.broke)):
        if flipped:
            lines += ["", f"{title} (at how many of the seeds both evaluated it):", ""]
            lines += [
                f"- `{f.example_id}` ({f.seeds}/{f.of}): {snippets.get(f.example_id, '')}{link(f.example_id)}" for f in flipped
            ]
    return lines


def per_example_markdown(pairs: Sequence[PairExamples], rows: Sequence[Mapping[str, Any]], links: FlipLinks | None = None) -> str:
    """The report section; empty when no evaluation left per-example rows with verdicts. ``links``:
    each pair's flip page, linked from every listed example it shows."""
    if not pairs:
        return ""
    snippets = prompt_snippets(rows)
    files = sorted({str(row.get("file", "")) for row in final_step_rows(rows)} - {""})
    lines = [
        "## Per-example comparison (held-out examples, the last evaluation of each seed)",
        "",
        "Read from the runs' `eval_examples/` artifacts"
        + (f" ({', '.join(f'`{f}`' for f in files[:4])}{', …' if len(files) > 4 else ''})" if files else "")
        + ". An example counts as solved when more than half its completions were correct.",
        "",
        f"**Does the recipe differ?** The {CONFIDENCE:.0%} interval of the mean per-seed accuracy difference from a "
        "two-stage bootstrap: seeds drawn with replacement, then examples within each drawn seed, on the paired "
        "per-example differences (shrunken seed means, so evaluation noise counts once; Student t on seeds − 1 "
        "degrees of freedom). Seeds are the replications: the example level only removes evaluation noise, it never "
        "adds replications. Not Holm-corrected; the verdicts above are the report's.",
        "",
        "| dataset | difference | seeds | examples per seed | difference (recipe) | says |",
        "|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        sizes = sorted({counts.examples for counts in pair.per_seed.values()})
        shown = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
        lines.append(
            f"| {pair.dataset} | {pair.first} − {pair.second} | {len(pair.per_seed)} | {shown} | {_interval(pair.recipe)} "
            f"| {recipe_said(pair)} |"
        )
    lines += [
        "",
        "**Do these trained checkpoints differ?** Per seed, examples as the sample (a paired bootstrap over examples, "
        "and McNemar's exact test on the examples one arm solves and the other not). This is **not a verdict about "
        "the recipe**: two seeds of the same recipe differ like this too.",
        "",
    ]
    for pair in pairs:
        lines += [f"### {pair.dataset}: {pair.first} vs {pair.second}", "", *_flip_lines(pair, snippets, links), ""]
    return "\n".join(lines)


def with_section(report: str, section: str, *, before: str = "\n## Curves") -> str:
    """``report`` with ``section`` inserted before its ``before`` heading (else at the end)."""
    if not section:
        return report
    head, found, rest = report.partition(before)
    if not found:
        return report.rstrip("\n") + "\n\n" + section + "\n"
    return f"{head.rstrip(chr(10))}\n\n{section}\n{found}{rest}"
