"""``polyrl replay RUN --rewards other.yaml [--steps a:b]``: a run's stored groups re-scored under other
rewards, weights or reward aggregation, and how their advantages would have moved (polyrl/analysis/replay.py).

``RUN`` is ``run:<run_id>`` (its arm folder from the run's ``polyrl.checkpoint_dir`` tag), an arm
folder, or a store file (``<arm folder>/inspector/replay.jsonl.gz``). No policy is loaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyrl.cli.errors import fail, user_errors

console = Console()


def find_store(run: str, *, tracking_uri: str | None) -> tuple[Path, str | None]:
    """``(store file, run id or None)`` of ``run`` (see the module docstring)."""
    from polyrl.core.run_refs import RUN_PREFIX
    from polyrl.evals.models import CHECKPOINT_DIR_TAG
    from polyrl.tracking.replay_store import STORE_NAME, store_path

    if not run.startswith(RUN_PREFIX):
        path = Path(run).expanduser()
        store = path if path.is_file() else store_path(path)
        if not store.is_file():
            fail(f"{run!r}: not run:<run_id>, an arm folder holding inspector/{STORE_NAME}, or a store file")
        return store, None
    from mlflow.exceptions import MlflowException

    from polyrl.tracking.mlflow_runs import make_client, resolve_tracking_uri

    run_id, uri = run[len(RUN_PREFIX) :], resolve_tracking_uri(tracking_uri)
    try:
        tags = make_client(uri).get_run(run_id).data.tags
    except MlflowException as error:
        fail(f"{run!r}: no MLflow run {run_id!r} in {uri} ({error.message.splitlines()[0]})")
    folder = tags.get(CHECKPOINT_DIR_TAG)
    if not folder:
        fail(f"{run!r}: run {run_id} has no {CHECKPOINT_DIR_TAG} tag (is it a polyrl training arm run?)")
    store = store_path(folder)
    if not store.is_file():
        fail(f"{run!r}: no replay store at {store} (the run predates tracking.replay_store, or set it false)")
    return store, run_id


def _number(value: float, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def replay_command(
    run: str = typer.Argument(..., help="run:<run_id>, an arm folder, or a replay store file (inspector/replay.jsonl.gz)."),
    rewards: Path = typer.Option(
        ..., "--rewards", help="YAML with a rewards: list (as an experiment's) and optionally advantage.reward_aggregation."
    ),
    steps: Optional[str] = typer.Option(None, "--steps", help="a:b (both included), a:, :b or one step; default: all."),
    top: int = typer.Option(5, "--top", min=0, help="How many of the samples whose advantage moves most to show."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON here."),
    page: Optional[Path] = typer.Option(
        None,
        "--page",
        help="The rollout-inspector page of the top samples' groups (each printed sample links into it). "
        "Default: reports/replay/<run id, or the arm folder's last three parts>/movers.html.",
    ),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="For run:<id>. Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."
    ),
) -> None:
    """Re-score a run's stored groups under other rewards and compare the advantages (no policy loaded)."""
    from polyrl.analysis.replay import ReplayError, parse_steps, replay, select_steps
    from polyrl.config.schema import read_yaml
    from polyrl.tracking.replay_store import read_store

    with user_errors(str):
        store, run_id = find_store(run, tracking_uri=tracking_uri)
        try:
            header, records = read_store(store)
        except (OSError, ValueError) as error:
            fail(f"{store}: {error}")
        if run_id is not None and header.get("run_id") not in (None, run_id):
            fail(f"{store} belongs to run {header['run_id']}, not {run_id}: a later run reused the folder")
        chosen = select_steps(records, *parse_steps(steps))
        if not chosen:
            raise ReplayError(
                f"the store holds steps {min(records, default='-')}..{max(records, default='-')}; none in {steps!r}"
            )
        report = replay(header, chosen, read_yaml(rewards), source=str(rewards), base_dir=rewards.parent, top=top)
    page_path = None
    if report.groups:
        from polyrl.analysis.replay_page import movers_page

        # An arm folder is <checkpoint.dir>/<experiment>/<arm>[/seed_<s>]: its last parts name it.
        folder = run_id or "-".join(store.parent.parent.parts[-3:])
        page_path = page or Path("reports") / "replay" / folder / "movers.html"
        page_path.parent.mkdir(parents=True, exist_ok=True)
        page_path.write_text(movers_page(report.groups, title=f"reward replay: {store}"), encoding="utf-8")
    _print(report, store, page_path)
    if json_out is not None:
        payload = {
            "store": str(store), "steps": {str(k): v for k, v in report.steps.items()}, "overall": report.overall,
            "top": report.top, "groups": report.groups, "page": page_path and str(page_path), "reused": report.reused, "rescored": report.rescored,
            "score_seconds": report.score_seconds, "seconds_per_1000": report.seconds_per_1000, "notes": report.notes,
        }  # fmt: skip
        json_out.write_text(json.dumps(payload, indent=2, default=str))
        console.print(f"report: {json_out}")


def _print(report, store: Path, page: Path | None) -> None:
    table = Table(title=f"reward replay: {store}")
    for column in ("step", "samples", "groups", "sign changes", "Spearman (groups)", "became uniform", "stopped uniform"):
        table.add_column(column, justify="right")
    rows = [(str(step), row) for step, row in report.steps.items()] + [("all", report.overall)]
    for name, row in rows:
        table.add_row(
            name, f"{row['samples']:.0f}", f"{row['groups']:.0f}", _number(row["sign_change_share"]),
            f"{_number(row['spearman_mean'])} ({row['spearman_groups']:.0f})", f"{row['became_uniform']:.0f}",
            f"{row['stopped_uniform']:.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"reused stored scores: {', '.join(report.reused) or '-'} · re-scored: {', '.join(report.rescored) or '-'}"
        + (f" ({_number(report.seconds_per_1000, 2)} s per 1,000 samples)" if report.rescored else "")
    )
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    if page is not None:
        console.print(f"the top samples' groups, in the rollout inspector: {page}", highlight=False)
    for moved in report.top:
        text = moved["text"].replace("\n", " ")
        console.print(
            f"step {moved['step']} group {moved['group']}: advantage {moved['old_advantage']:+.3f} -> "
            f"{moved['new_advantage']:+.3f}; scores {moved['old_scores']} -> {moved['new_scores']}; "
            f"{escape(text[:80])}{'…' if len(text) > 80 else ''}"
            + (f" · {page.name}#group={moved['page_group']}" if page is not None else ""),
            highlight=False,
        )
