"""The judge and the learned scorer where users meet them: a training run (a few steps on the tiny
policy, with the judge/rule health check on), the eval harness that ``polyrl eval`` runs, and
``polyrl rewards check`` with its throughput line."""

from __future__ import annotations

import json
import math

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.engines.hf_engine import HFRolloutEngine
from polyrl.evals import SuiteRunner, parse_suite
from polyrl.launch.runner import run_experiment

pytestmark = pytest.mark.slow


def _rewards(chat_model_dir, scorer_dirs):
    return [
        {"module": "judge", "weight": 0.1, "params": {"model": str(chat_model_dir), "min_score_mass": 1e-9}},
        {"module": "learned_scorer", "weight": 1.0, "params": {"model": str(scorer_dirs[1])}},
        {"module": "length", "weight": 0.01, "params": {"unit": "chars"}},
    ]


def test_a_run_trains_on_judge_and_scorer_rewards(tmp_path, tiny_experiment, write_experiment, chat_model_dir, scorer_dirs):
    config = tiny_experiment(
        rewards=_rewards(chat_model_dir, scorer_dirs),
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        train={"steps": 2},
        health={"judge_rule_pairs": {"judge": "length"}},
    )
    result = run_experiment(write_experiment(tmp_path, config), console=Console(quiet=True), show_progress=False)
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.arm_run_ids[next(iter(result.arm_run_ids))])
    metrics = run.data.metrics
    for label in ("judge", "learned_scorer"):
        assert metrics[f"reward/{label}/unscored"] == 0 and math.isfinite(metrics[f"reward/{label}/mean"])
        assert 1 <= metrics["reward/judge/mean"] <= 5
    assert math.isfinite(metrics["actor/loss"])
    # The reward-hacking checks ran on the step's samples and logged their figures.
    assert "health/distinct_per_prompt" in metrics and "health/component_share/learned_scorer" in metrics
    assert "health/judge_rule_corr/judge" in metrics


def test_the_eval_harness_scores_with_them(tmp_path, random_policy_dir, chat_model_dir, scorer_dirs):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "4"}) + "\n" for p in ("2+2=", "1+3=")))
    suite = parse_suite(
        {
            "name": "judged",
            "datasets": [{"name": "add", "source": str(data)}],
            "generation": {"decoding": "sample", "n": 2, "max_tokens": 6},
            "metrics": {"rewards": _rewards(chat_model_dir, scorer_dirs)},
        }
    )
    engine = HFRolloutEngine(str(random_policy_dir), device="cpu")
    result = SuiteRunner(suite).run(engine)
    assert 1 <= result.metrics["add/reward/judge/mean"] <= 5
    assert math.isfinite(result.metrics["add/reward/learned_scorer/mean"])
    assert all(row["reward/judge"] is not None for row in result.rows)


def test_rewards_check_reports_throughput(tmp_path, chat_model_dir):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "2+2=", "completion": c}) + "\n" for c in ("4", "5", "four")))
    params = json.dumps({"model": str(chat_model_dir), "min_score_mass": 1e-9})
    result = CliRunner().invoke(app, ["rewards", "check", "judge", "--data", str(data), "--params", params])
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output
