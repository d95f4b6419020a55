"""Held-out evaluation of episodes: an eval suite played with the run's environment."""

from __future__ import annotations

import json

import pytest

from polyrl.config.schema import ExperimentConfig
from polyrl.evals.periodic import make_periodic_evaluator

SUITE = {
    "name": "guess_eval",
    "kind": "text",
    "datasets": [{"name": "guess", "source": "guess_number", "split": "test", "limit": 3}],
    # The random tiny model never writes its end-of-turn token; "e" ends its turns early.
    "generation": {"decoding": "sample", "n": 2, "max_tokens": 8, "stop": ["e"]},
    "metrics": {"accuracy": True, "length": False, "pass_at_k": [1, 2]},
}


@pytest.mark.slow
def test_periodic_eval_plays_episodes(tmp_path, tiny_arch_dir, write_experiment):
    import yaml

    from polyrl.engines.hf_engine import HFRolloutEngine

    suite = tmp_path / "guess_eval.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    model = tiny_arch_dir("qwen2")
    config = ExperimentConfig.model_validate({
        "name": "e", "model": {"path": str(model)}, "data": {"source": "guess_number"},
        "env": {"module": "guess_number", "max_turns": 2, "max_episode_tokens": 120},
        "eval": {"every": 1, "suite": str(suite)},
    })  # fmt: skip
    evaluator = make_periodic_evaluator(config)
    result = evaluator(HFRolloutEngine(str(model), seed=0), 0)
    metrics = result.metrics
    for key in ("accuracy", "pass_at_1", "pass_at_2", "return_mean", "episode/turns_mean", "episode/tool_call_rate"):
        assert f"guess/{key}" in metrics, sorted(metrics)
    assert 1.0 <= metrics["guess/episode/turns_mean"] <= 2.0
    # pass@1 over n = 2 samples is the mean share correct: the accuracy.
    assert metrics["guess/pass_at_1"] == pytest.approx(metrics["guess/accuracy"])
    assert len(result.rows) == 6  # 3 games x 2 episodes
    assert json.loads(result.rows[0]["episode"])["turns"][0]["role"] == "user"


@pytest.mark.slow
def test_polyrl_eval_with_an_environment(tmp_path, tiny_arch_dir):
    import yaml

    from polyrl.evals.episodes import EpisodeOptions
    from polyrl.evals.evaluate import EngineOptions, evaluate_models

    suite = tmp_path / "guess_eval.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    outcome = evaluate_models(
        [str(tiny_arch_dir("qwen2"))],
        suite,
        engine=EngineOptions("hf", max_model_len=512),
        out=tmp_path / "report",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        episodes=EpisodeOptions("guess_number", max_turns=2, max_episode_tokens=120),
    )
    (result,) = outcome.results
    assert {"guess/accuracy", "guess/pass_at_2", "guess/episode/tool_call_rate"} <= set(result.metrics)
    assert len(result.rows) == 6
    assert (tmp_path / "report" / "samples.html").exists()  # the episodes turn by turn


def test_polyrl_eval_refuses_env_options_without_env():
    from typer.testing import CliRunner

    from polyrl.cli.main import app

    out = CliRunner().invoke(app, ["eval", "--model", "x", "--suite", "calculator", "--max-turns", "2", "--env-stop", "e"])
    assert out.exit_code != 0 and "only with --env" in out.output
