"""``polyrl compare`` reads the runs' per-example artifacts (eval_examples/…): flip tables, the
recipe- and checkpoint-level intervals in report.md; and the curve summaries (area under the
held-out curve, mean of the last evaluations) compared like final values."""

from __future__ import annotations

import json

import pytest

from polyrl.analysis.compare import compare_experiment
from polyrl.analysis.curve_summaries import curve_auc, last_k_mean
from polyrl.analysis.example_runs import experiment_example_rows
from polyrl.analysis.per_example import FlipCounts
from polyrl.tracking.mlflow_runs import ExperimentTracker

STEPS = 2
EXAMPLES = ["e1", "e2", "e3", "e4"]
# Correct at the last evaluation (step 2), examples e1..e4:
#   seed 0: a 1100, b 1000 -> both 1 (e1), only a 1 (e2), only b 0, neither 2
#   seed 1: a 1110, b 0100 -> both 1 (e2), only a 2 (e1, e3), only b 0, neither 1
#   seed 2: a 0101, b 1100 -> both 1 (e2), only a 1 (e4), only b 1 (e1), neither 1
# Pooled: both 3, only a 4, only b 1, neither 4. Per-seed mean differences 1/4, 2/4, 0/4: mean 0.25.
FINAL = {
    "a": {0: [1, 1, 0, 0], 1: [1, 1, 1, 0], 2: [0, 1, 0, 1]},
    "b": {0: [1, 0, 0, 0], 1: [0, 1, 0, 0], 2: [1, 1, 0, 0]},
}
# eval/d/accuracy at steps 0, 1, 2 (step 2: the share above).
CURVE = {
    "a": {0: [0.0, 0.5, 0.5], 1: [0.0, 0.5, 0.75], 2: [0.0, 0.5, 0.5]},
    "b": {0: [0.0, 0.25, 0.25], 1: [0.0, 0.25, 0.25], 2: [0.0, 0.25, 0.5]},
}


def _jsonl(arm, seed, step, correct, samples_file=None):
    rows = [
        {"example_id": e, "dataset": "d", "sample": 0, "arm": arm, "seed": seed, "step": step, "correct": bool(c),
         "score": float(c), "length": 3, "sample_ref": samples_file and f"{samples_file}#{i}",
         "prompt": f"What is question {e}?"}
        for i, (e, c) in enumerate(zip(EXAMPLES, correct))
    ]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows)


def _sample_table(arm, seed, correct):
    """The evaluation's sample table the rows' sample_ref point into (one completion per example)."""
    return [
        {"step": 2, "dataset": "d", "example_id": e, "prompt": f"What is question {e}?",
         "completion": f"{arm}{seed} says {'right' if c else 'wrong'} to {e}", "reward": float(c), "length": 3,
         "finish_reason": "stop", "correct": float(c)}
        for e, c in zip(EXAMPLES, correct)
    ]  # fmt: skip


def _experiment(uri: str, name: str, *, sample_tables: bool = False) -> None:
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    for arm, by_seed in FINAL.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, correct in by_seed.items():
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": STEPS})
            for step, value in enumerate(CURVE[arm][seed]):
                run.log_metrics(step, {"eval/d/accuracy": value})
                if step:
                    run.log_step(step, {"reward/mean": value, "perf/step_s": 0.1})
            run.log_text(_jsonl(arm, seed, 1, [0, 0, 0, 0]), "eval_examples/s/step_00001.jsonl")  # not the last: unused
            table = "eval_samples/step_00002.json" if sample_tables else None
            if table:
                run.log_table(_sample_table(arm, seed, correct), table)
            run.log_text(_jsonl(arm, seed, 2, correct, table), "eval_examples/s/step_00002.jsonl")
            run.finish()
        arm_run.finish()
    parent.finish()


def test_compare_reports_flip_tables_and_both_intervals(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "flips")
    comparison = compare_experiment("flips", tracking_uri=mlflow_uri, out_dir=tmp_path / "out", log_to_mlflow=False)
    (pair,) = comparison.per_example
    assert (pair.dataset, pair.first, pair.second) == ("d", "a", "b")
    assert pair.per_seed == {0: FlipCounts(1, 1, 0, 2), 1: FlipCounts(1, 2, 0, 1), 2: FlipCounts(1, 1, 1, 1)}
    assert pair.pooled == FlipCounts(both=3, only_a=4, only_b=1, neither=4)
    assert pair.recipe.estimate == pytest.approx(0.25) and pair.recipe.n == 3
    # Seed 1's checkpoints: a − b = (1 + 0 + 1 + 0)/4 = 0.5; McNemar 2 vs 0: 2 · (½)² = 0.5.
    assert pair.checkpoints[1].interval.estimate == pytest.approx(0.5) and pair.checkpoints[1].mcnemar_p == pytest.approx(0.5)
    assert [f.example_id for f in pair.fixed] == ["e1", "e2", "e3", "e4"] and [f.example_id for f in pair.broke] == ["e1"]
    report = (tmp_path / "out" / "report.md").read_text()
    section = report[report.index("## Per-example comparison") : report.index("## Curves (")]
    assert "| d | a − b | 3 | 4 | +0.25 [" in section
    assert "| pooled | 12 | 3 | 4 | 1 | 4 |" in section
    assert "not a verdict about" in section and "never adds replications" in section
    assert "- `e1` (1/3): What is question e1?\n" in section  # no sample tables: no link to completions
    rows = experiment_example_rows("flips", tracking_uri=mlflow_uri)
    assert len(rows) == 2 * 3 * 4 and {row["step"] for row in rows} == {2}
    assert len(experiment_example_rows("flips", tracking_uri=mlflow_uri, final_only=False)) == 2 * 2 * 3 * 4


def test_each_flipped_example_links_both_arms_completions(tmp_path, mlflow_uri):
    """The examples the report lists as fixed or broke link to a rollout-inspector page holding
    both arms' completions of that example (read through each row's sample_ref), one prompt
    group per example in the report's order; without sample tables there is no link (above)."""
    _experiment(mlflow_uri, "flip_links", sample_tables=True)
    stale = tmp_path / "out" / "flips" / "d__a_vs_gone.html"  # an earlier report's pair: not left to mislead
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    compare_experiment("flip_links", tracking_uri=mlflow_uri, out_dir=tmp_path / "out", log_to_mlflow=False)
    assert not stale.exists()
    report = (tmp_path / "out" / "report.md").read_text()
    # Fixed: e1..e4 (groups 0..3, the report's order); broke: e1 again (its group 0).
    page_link = "flips/d__a_vs_b.html"
    assert f"- `e1` (1/3): What is question e1? · [both arms' completions]({page_link}#group=0)" in report
    assert f"- `e4` (1/3): What is question e4? · [both arms' completions]({page_link}#group=3)" in report
    page = (tmp_path / "out" / page_link).read_text()
    data = json.loads(page[page.index("id='data'") :].split(">", 1)[1].split("</script>", 1)[0])
    e1 = [(row["l"], row["c"]) for row in data["rows"] if row["g"] == 0]
    # e1 at the last evaluation: a 1,1,0 and b 1,0,1 over seeds 0,1,2; arm a first, then by seed.
    assert e1 == [
        ("a · seed 0 · right · example e1", "a0 says right to e1"),
        ("a · seed 1 · right · example e1", "a1 says right to e1"),
        ("a · seed 2 · wrong · example e1", "a2 says wrong to e1"),
        ("b · seed 0 · right · example e1", "b0 says right to e1"),
        ("b · seed 1 · wrong · example e1", "b1 says wrong to e1"),
        ("b · seed 2 · right · example e1", "b2 says right to e1"),
    ]
    assert data["prompts"] == [f"What is question {e}?" for e in EXAMPLES]


def test_curve_summaries_are_compared_by_seed(tmp_path, mlflow_uri):
    # Area: points (0, 0), (1, v1), (2, v2) → (v1/2 + (v1 + v2)/2) / 2.
    assert curve_auc([(0, 0.0), (1, 0.5), (2, 0.75)]) == pytest.approx((0.25 + 0.625) / 2)
    assert curve_auc([(5, 0.3)]) == 0.3
    assert last_k_mean([(0, 0.0), (1, 0.5), (2, 0.75)], 2) == pytest.approx(0.625)
    _experiment(mlflow_uri, "curves")
    comparison = compare_experiment("curves", tracking_uri=mlflow_uri, out_dir=tmp_path / "out", log_to_mlflow=False)
    report = (tmp_path / "out" / "report.md").read_text()
    # a − b per seed, area: 0.375 − 0.1875, 0.4375 − 0.1875, 0.375 − 0.25 → mean (0.1875 + 0.25 + 0.125)/3 = 0.1875.
    # Last 3: (1/3 − 1/6), (5/12 − 1/6), (1/3 − 1/4) → mean (2 + 3 + 1)/12/3 = 1/6 = 0.1667.
    section = report[report.index("## Curve summaries") :]
    assert "| eval/d/accuracy/auc | a − b | 0.188 |" in section
    assert "| eval/d/accuracy/last3_mean | a − b | 0.167 |" in section
    assert "eval/d/accuracy/auc" in comparison.table_markdown
    asked = compare_experiment(
        "curves", tracking_uri=mlflow_uri, out_dir=tmp_path / "asked", log_to_mlflow=False, metrics=["eval/d/accuracy/last2_mean"]
    )
    # Last 2: a (0.5, 0.625, 0.5), b (0.25, 0.25, 0.375) → differences 0.25, 0.375, 0.125: mean 0.25.
    assert [(row[0], round(row[3].interval.estimate, 4)) for row in asked.differences] == [("eval/d/accuracy/last2_mean", 0.25)]
