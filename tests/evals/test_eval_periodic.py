"""Periodic evaluation: ``make_periodic_evaluator(config)`` on the training run's own engine."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.config.schema import ExperimentConfig
from polyrl.evals import SuiteRunner
from polyrl.evals.periodic import make_periodic_evaluator
from polyrl.evals.suite import EvalError

ROWS = [{"prompt": f"Q: {i}+2=? A:", "answer": str(i + 2)} for i in range(5)]


@pytest.fixture
def periodic_suite(tmp_path, jsonl, suite_file):
    jsonl(tmp_path / "p.jsonl", ROWS)
    return suite_file(
        tmp_path / "periodic.yaml",
        {
            "name": "periodic",
            "datasets": {"name": "p", "source": "p.jsonl"},
            "generation": {"decoding": "greedy", "max_tokens": 4},
            "metrics": {"accuracy": {"extract": "last_number"}, "rewards": [{"module": "length"}]},
        },
    )


def test_eval_periodic_evaluator_uses_suite_limit_and_engine(periodic_suite, hf_engine):
    config = ExperimentConfig(name="p", eval={"every": 2, "suite": str(periodic_suite), "limit": 3})
    evaluator = make_periodic_evaluator(config)
    rng = torch.get_rng_state()
    result = evaluator(hf_engine, 4)
    metrics = result.metrics
    assert torch.equal(torch.get_rng_state(), rng)  # the training run's random stream is untouched
    assert result.result.datasets == {"p": {"prompts": 3, "samples": 3}}
    direct = SuiteRunner(periodic_suite, limit=3).run(hf_engine).metrics
    assert metrics == pytest.approx({k: v for k, v in direct.items() if math.isfinite(v)})
    assert {"p/accuracy", "p/length/mean", "p/reward/length/mean"} <= set(metrics)
    rows = result.rows
    assert metrics["p/length/mean"] == pytest.approx(sum(r["length"] for r in rows) / 3)


def test_eval_periodic_evaluator_fails_early_on_a_bad_suite(tmp_path):
    with pytest.raises(EvalError, match="eval.suite"):
        make_periodic_evaluator(ExperimentConfig(name="p"))
    with pytest.raises(EvalError, match="known suites"):
        make_periodic_evaluator(ExperimentConfig(name="p", eval={"every": 1, "suite": "no_such_suite"}))


def test_eval_periodic_metrics_reach_the_training_run(tmp_path, periodic_suite, tiny_model, eval_tracking):
    """Two training steps with eval.every = 1: eval/<metric> is logged at step 0 (the start) and each step."""
    import yaml
    from mlflow.tracking import MlflowClient

    from polyrl.launch.runner import run_experiment

    config = {
        "name": "periodic-e2e",
        "model": {"path": str(tiny_model)},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 4},
        "rewards": [{"module": "length", "params": {"unit": "chars"}}],
        "train": {"steps": 2, "micro_batch_size": 4},
        "tracking": {"uri": eval_tracking, "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
        "eval": {"every": 1, "suite": str(periodic_suite), "limit": 2},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_experiment(path, console=None, show_progress=False)
    client = MlflowClient(eval_tracking)
    history = client.get_metric_history(result.arm_run_ids["main"], "eval/p/accuracy")
    # Step 0 is the starting policy (the trainer evaluates it before the first update).
    assert sorted(m.step for m in history) == [0, 1, 2]
    lengths = client.get_metric_history(result.arm_run_ids["main"], "eval/p/length/mean")
    assert all(0 <= m.value <= 4 for m in lengths)
    _check_example_artifacts(client, result.arm_run_ids["main"], tmp_path / "artifacts", lengths)


def _check_example_artifacts(client, run_id, folder, lengths):
    """Each evaluation (steps 0, 1, 2) left eval_examples/<suite>/step_<n>.jsonl in the arm's run:
    one row per held-out example (limit 2, one completion each), its sample_ref a row of the
    sample table logged beside it, its lengths those the eval/p/length/mean metric averaged."""
    import json

    from polyrl.core.types import PromptSample
    from polyrl.evals.example_outcomes import example_id

    files = sorted(a.path for a in client.list_artifacts(run_id, "eval_examples/periodic"))
    assert files == [f"eval_examples/periodic/step_{step:05d}.jsonl" for step in (0, 1, 2)]
    mean_length = {m.step: m.value for m in lengths}
    for step in (0, 1, 2):
        path = client.download_artifacts(run_id, f"eval_examples/periodic/step_{step:05d}.jsonl", str(folder))
        rows = [json.loads(line) for line in open(path)]
        assert [row["example_id"] for row in rows] == [example_id(PromptSample(r["prompt"])) for r in ROWS[:2]]
        assert {(row["arm"], row["seed"], row["step"], row["dataset"]) for row in rows} == {("main", 0, step, "p")}
        assert all(isinstance(row["correct"], bool) and row["score"] == float(row["correct"]) for row in rows)
        assert sum(row["length"] for row in rows) / 2 == pytest.approx(mean_length[step])
        table_file, _, index = rows[1]["sample_ref"].partition("#")
        table = json.load(open(client.download_artifacts(run_id, table_file, str(folder))))
        sample = dict(zip(table["columns"], table["data"][int(index)]))
        assert sample["example_id"] == rows[1]["example_id"] and sample["length"] == rows[1]["length"]
