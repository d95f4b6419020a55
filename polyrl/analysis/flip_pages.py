"""The completions behind a flip table: one rollout-inspector page per compared pair of arms and
held-out dataset, with both arms' held-out completions of every example the report lists as
fixed or broke, so a reader goes from "seed 1 solves `ex-17`, the baseline does not" to the two
answers in one click.

The report's examples are read from the runs' ``eval_examples/`` rows (:mod:`polyrl.evals.
example_outcomes`); each row's ``sample_ref`` (``<sample table>#<row>``) names the completion in
the evaluation's sample table, which is read from the run's artifacts here. The page is the
rollout inspector's (:mod:`polyrl.tracking.inspector`): one prompt group per example, each
completion labelled with its arm, seed and verdict; ``#group=<g>`` opens it on one example, side
by side. An example whose completions cannot be found (a run without sample tables) gets no link.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mlflow.tracking import MlflowClient

from polyrl.analysis.per_example import final_step_rows
from polyrl.analysis.report_metrics import safe_file_stem
from polyrl.tracking.inspector import inspector_html, inspector_rows

if TYPE_CHECKING:
    from polyrl.analysis.per_example_report import PairExamples

FLIPS_FOLDER = "flips"  # beside report.md (and under the parent run's comparison/ artifacts)

# (run id, sample table file) -> the table's rows, as the evaluation logged them.
SampleTables = Callable[[str, str], Sequence[Mapping[str, Any]]]


def flip_page_file(dataset: str, first: str, second: str) -> str:
    """The page's file name for one (dataset, pair)."""
    return f"{safe_file_stem(dataset)}__{safe_file_stem(first)}_vs_{safe_file_stem(second)}.html"


def mlflow_sample_tables(client: MlflowClient) -> SampleTables:
    """Reads an evaluation's sample table from a run's artifacts (MLflow's table JSON:
    ``{"columns": [...], "data": [[...], ...]}``), each table once."""
    cache: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def table(run_id: str, file: str) -> list[dict[str, Any]]:
        if (run_id, file) not in cache:
            with tempfile.TemporaryDirectory() as folder:
                data = json.loads(Path(client.download_artifacts(run_id, file, folder)).read_text(encoding="utf-8"))
            cache[(run_id, file)] = [dict(zip(data["columns"], values)) for values in data["data"]]
        return cache[(run_id, file)]

    return table


def _completion(row: Mapping[str, Any], tables: SampleTables) -> Mapping[str, Any] | None:
    """The sample-table row a per-example row points at, or None where there is none to read."""
    ref, run_id = row.get("sample_ref"), row.get("run_id")
    if not ref or not run_id or "#" not in str(ref):
        return None
    file, _, index = str(ref).rpartition("#")
    try:
        rows = tables(str(run_id), file)
    except Exception:  # a deleted artifact or another store layout: the example gets no link, the report stands
        return None
    return rows[int(index)] if index.isdigit() and int(index) < len(rows) else None


def flip_page(
    dataset: str,
    first: str,
    second: str,
    example_ids: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    tables: SampleTables,
) -> tuple[str, dict[str, int]] | None:
    """The inspector page of ``example_ids`` (in the report's order) for this pair, from the
    per-example ``rows`` of each (arm, seed)'s last evaluation (:func:`final_step_rows`, as the
    flip table reads them), and each shown example's prompt group on it; None when no completion
    could be read."""
    final = [r for r in rows if r["dataset"] == dataset and r["arm"] in (first, second)]
    samples: list[dict[str, Any]] = []
    prompts: list[str] = []
    groups: dict[str, int] = {}
    for example in dict.fromkeys(example_ids):
        mine = sorted(
            (r for r in final if str(r["example_id"]) == example),
            key=lambda r: (r["arm"] != first, int(r["seed"]), int(r.get("sample") or 0)),
        )
        found = [(r, c) for r in mine if (c := _completion(r, tables)) is not None]
        if not found:
            continue
        groups[example] = len(prompts)
        # The inspector groups its rows by prompt text: one text per example, whatever the arms'.
        prompts.append(str(found[0][1].get("prompt", "")))
        for row, completion in found:
            verdict = {True: "right", False: "wrong", None: "no verdict"}[row.get("correct")]
            samples.append(
                {
                    **completion,
                    "prompt": prompts[-1],
                    "label": f"{row['arm']} · seed {row['seed']} · {verdict} · example {example}",
                }
            )
    if not samples:
        return None
    page = inspector_html(inspector_rows(samples), title=f"flipped examples: {dataset}, {first} vs {second}", prompts=prompts)
    return page, groups


def write_flip_pages(
    pairs: Sequence[PairExamples], rows: Sequence[Mapping[str, Any]], tables: SampleTables, out: Path
) -> tuple[dict[tuple[str, str, str], tuple[str, dict[str, int]]], list[Path]]:
    """Each pair's page under ``out/flips/``; returns the links the report's section takes
    (:data:`polyrl.analysis.per_example_report.FlipLinks`) and the files written."""
    links: dict[tuple[str, str, str], tuple[str, dict[str, int]]] = {}
    paths: list[Path] = []
    for stale in (out / FLIPS_FOLDER).glob("*.html"):  # the folder is this report's: a pair no longer listed goes
        stale.unlink()
    final = final_step_rows(rows)  # once for every pair
    for pair in pairs:
        shown = [f.example_id for f in pair.fixed + pair.broke]
        made = flip_page(pair.dataset, pair.first, pair.second, shown, final, tables) if shown else None
        if made is None:
            continue
        name = flip_page_file(pair.dataset, pair.first, pair.second)
        (out / FLIPS_FOLDER).mkdir(parents=True, exist_ok=True)
        (out / FLIPS_FOLDER / name).write_text(made[0], encoding="utf-8")
        links[(pair.dataset, pair.first, pair.second)] = (f"{FLIPS_FOLDER}/{name}", made[1])
        paths.append(out / FLIPS_FOLDER / name)
    return links, paths
