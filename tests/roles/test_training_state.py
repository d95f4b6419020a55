"""Training state stays one step or the other: a non-finite stop in the middle of an update,
the critic's non-finite guard across a checkpoint, and the engine's dtype on resume."""

from __future__ import annotations

import math

import pytest
import torch
from learner_helpers import built, snapshot
from safetensors.torch import load_file

from polyrl.engines.base import RolloutEngine
from polyrl.roles.checkpoint import latest_checkpoint, read_checkpoint_info
from polyrl.roles.health import NonFiniteTrainingError


def _nan_on_call(learner, call: int):
    """The ``call``-th policy loss of the learner (1-based, counting from now) comes out NaN."""
    original, calls = learner.policy_loss, {"n": 0}

    def policy_loss(*args, **kwargs):
        calls["n"] += 1
        loss, metrics, logprobs = original(*args, **kwargs)
        return (loss * math.nan if calls["n"] == call else loss), metrics, logprobs

    learner.policy_loss = policy_loss


def _adam_moments(optimizer) -> list[torch.Tensor]:
    return [state[key].clone() for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]


def test_a_nan_on_the_second_mini_batch_stops_with_the_last_whole_step_saved(tmp_path, tiny_experiment):
    # 2 mini-batches (one micro-batch each at micro_batch_size 8 of 16 samples), a stop after 1
    # non-finite step: step 2's first mini-batch is applied, its second is NaN and stops the run.
    config = tiny_experiment(train={"steps": 4, "mini_batches": 2, "max_consecutive_nonfinite": 1}, checkpoint={"every": 10})
    with built(tmp_path, config) as arm:
        loop = arm.loop(printer=lambda line: None)
        loop.step()
        after_step_1 = snapshot(arm.learner.policy)
        moments = _adam_moments(arm.learner.optimizer)
        assert arm.learner.optimizer_step == 2
        _nan_on_call(arm.learner, 2)
        with pytest.raises(NonFiniteTrainingError, match="training stopped in step 2"):
            loop.step()
        learner = arm.learner
        # Before the fix: the weights, AdamW and the counter held step 2's first optimizer step.
        assert all(torch.equal(after_step_1[name], p) for name, p in learner.policy.named_parameters())
        assert learner.optimizer_step == 2
        assert all(torch.equal(a, b) for a, b in zip(moments, _adam_moments(learner.optimizer)))
    checkpoint = latest_checkpoint(tmp_path / "runs" / "main")
    info = read_checkpoint_info(checkpoint)
    assert checkpoint.name == "step_000001" and info["step"] == 1 and info["optimizer_step"] == 2
    saved = load_file(str(checkpoint / "policy.safetensors"))
    assert all(torch.equal(saved[name], after_step_1[name]) for name in after_step_1)
    saved_moments = load_file(str(checkpoint / "policy_optimizer.safetensors"))
    assert all(
        torch.equal(saved_moments[f"{i}.{key}"], arm.learner.optimizer.state[p][key])
        for i, p in enumerate(arm.learner.policy.parameters())
        for key in ("exp_avg", "exp_avg_sq")
    )


def test_the_critics_nonfinite_count_is_checkpointed(tmp_path, tiny_experiment):
    config = tiny_experiment(
        objective={"name": "ppo"}, advantage={"estimator": "gae"}, train={"steps": 2, "max_consecutive_nonfinite": 3}
    )
    with built(tmp_path, config) as arm:
        arm.critic.guard.consecutive = 2
        arm.checkpointer.save(1)
    assert read_checkpoint_info(latest_checkpoint(tmp_path / "runs" / "main"))["critic_nonfinite"] == {"consecutive": 2}
    with built(tmp_path, config, resume=True) as resumed:
        # Before: the count restarted at 0, so a resumed critic allowed 3 more non-finite steps instead of 1.
        assert resumed.critic.guard.consecutive == 2


class RecordingEngine(RolloutEngine):
    """Records the dtypes of the weights each sync brings (a fake engine: only the sync is looked at)."""

    name = "recording"

    def __init__(self):
        self.synced: list[set[torch.dtype]] = []

    def generate(self, prompts, settings):  # pragma: no cover - not called
        raise AssertionError("no generation here")

    def sync_weights(self, named_tensors) -> None:
        self.synced.append({tensor.dtype for _, tensor in named_tensors})


def test_a_resumed_engine_is_synced_in_the_sampling_dtype_not_the_learners(tmp_path, tiny_experiment):
    # float32 learner, bfloat16 sampler: every sync (the loop's and the resume's) must bring bf16.
    config = tiny_experiment(model={"dtype": "float32"}, rollout={"dtype": "bfloat16"}, train={"steps": 2})
    with built(tmp_path, config) as arm:
        arm.checkpointer.save(1)
    engine = RecordingEngine()
    with built(tmp_path, config, resume=True, engine=engine) as resumed:
        assert resumed.start_step == 1
    assert engine.synced == [{torch.bfloat16}]  # before: {torch.float32}, the learner's compute dtype
