"""``polyrl compare``'s console output fits a 100-column terminal: the verdicts and a few headline
figures, not the report's full table (which wrapped: 16 columns, ``(n=1) (IQM …)`` in every cell)."""

from __future__ import annotations

from rich.console import Console

from polyrl.analysis.compare import compare_experiment
from polyrl.analysis.console_summary import console_summary
from polyrl.analysis.report_metrics import TABLE_METRICS
from polyrl.tracking.mlflow_runs import ExperimentTracker

ARMS = {"grpo_baseline_long_name": 0.0, "dr_grpo_with_length_fix": 0.1, "dapo_clip_higher": 0.2}
EVAL_KEYS = ("eval/arithmetic_chat/accuracy", "eval/arithmetic_chat/length/mean", "eval/arithmetic_chat/pass_at_4")


def _experiment(uri: str, name: str, seeds: list[int] | None) -> None:
    """Every default table metric and three held-out ones, two steps, arms × seeds (or one run per arm)."""
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    for arm, shift in ARMS.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        runs = [tracker.start_arm(arm_run.run_id, arm, seed=seed) for seed in seeds] if seeds else [arm_run]
        for index, run in enumerate(runs):
            run.log_params({"train.steps": 2})
            for step in (1, 2):
                value = 0.3 + shift + 0.01 * index + 0.1 * step
                run.log_step(step, {key: value for key in TABLE_METRICS})
                run.log_metrics(step, {key: value for key in EVAL_KEYS})
            run.finish()
        if seeds:
            arm_run.finish()
    parent.finish()


def _rendered(comparison, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    for renderable in console_summary(comparison):
        console.print(renderable, highlight=False)
    return console.export_text()


def test_compare_console_fits_100_columns(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "wide", [0, 1, 2])
    comparison = compare_experiment("wide", tracking_uri=mlflow_uri, out_dir=tmp_path / "seeded", log_to_mlflow=False)
    # What the command printed before: the report's table, far wider than the terminal.
    assert max(len(line) for line in comparison.table_markdown.splitlines()) > 300
    text = _rendered(comparison)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "IQM" not in text and "(n=" not in text
    # Verdicts first: the held-out accuracy's differences lead (every seed's difference is the same
    # constant, so each interval is that single value and excludes 0).
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("│ ") and "/" in line)
    row = " ".join(lines[first : first + 2])  # a row's cells fold over lines
    assert "│ eval/arithmetic_chat/ac" in row and "curacy" in row and "higher (Holm p <0.001)" in row
    assert "more differences in the report" in text  # the rest are in report.md
    assert text.index("differences") < text.index("final values")

    _experiment(mlflow_uri, "wide-one-seed", None)
    single = compare_experiment("wide-one-seed", tracking_uri=mlflow_uri, out_dir=tmp_path / "one", log_to_mlflow=False)
    text = _rendered(single)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "(n=1)" not in text and "one seed per arm" in text and "0.7" in text


def test_the_seeds_column_counts_finished_seeds_only(tmp_path, mlflow_uri):
    # grpo's seed 1 is still running (one step logged, not finished): the figures are over seed 0
    # alone, and the console said "2" seeds (it counted every seed run, as compare's own table did not).
    tracker = ExperimentTracker(mlflow_uri, "running")
    parent = tracker.start_parent("running")
    for arm in ("grpo", "dr_grpo"):
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed in (0, 1) if arm == "grpo" else (0,):
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": 2})
            for step in (1, 2) if seed == 0 else (1,):
                run.log_step(step, {key: 0.5 for key in TABLE_METRICS})
            if seed == 0:
                run.finish()
    comparison = compare_experiment("running", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    text = _rendered(comparison)
    rows = [line for line in text.splitlines() if line.startswith("│ grpo ") or line.startswith("│ dr_grpo ")]
    assert rows and all(line.split("│")[2].strip() == "1" for line in rows), rows
