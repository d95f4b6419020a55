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
