"""RL on image prompts end to end: `polyrl run` on scenes VQA with the built-in tiny VLM."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from tests.engine_settings import kv_cache_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_grpo_on_vqa_trains_with_the_sampler_in_sync(tmp_path, run_experiment_cli, engine):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = {
        "name": "vqa_tiny",
        "seed": 0,
        "model": {"builtin": {"task": "vqa", "warmup_steps": 40}},
        "data": {"source": "scenes", "limit": 64},
        "rollout": {
            "engine": engine,
            "prompts_per_step": 4,
            "samples_per_prompt": 4,
            "max_tokens": 12,
            **kv_cache_for(engine),
        },
        "objective": {"name": "grpo"},
        # A small length term keeps every group informative, so the two steps always update
        # the policy (with accuracy alone a 4-sample group can agree and give zero advantages).
        "rewards": [
            {"module": "accuracy", "params": {"extract": "full"}},
            {"module": "length", "weight": 0.01, "params": {"unit": "chars"}},
        ],
        "train": {"steps": 2, "learning_rate": 1e-3, "micro_batch_size": 8},
        "tracking": {"uri": uri, "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
    }
    run_experiment_cli(config)
    client = MlflowClient(uri)
    runs = [r for r in client.search_runs([client.get_experiment_by_name("vqa_tiny").experiment_id]) if r.data.metrics]
    run_id = runs[0].info.run_id
    losses = [m.value for m in client.get_metric_history(run_id, "actor/loss")]
    gaps = [m.value for m in client.get_metric_history(run_id, "rollout/logprob_gap")]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert max(m.value for m in client.get_metric_history(run_id, "actor/grad_norm")) > 0  # the policy was updated
    # Weights move between the steps (lr 1e-3); step 2's samples come from the synced engine.
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps
    accuracy = [m.value for m in client.get_metric_history(run_id, "reward/accuracy/mean")]
    assert all(0.0 <= v <= 1.0 for v in accuracy)
