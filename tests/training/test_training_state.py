"""Training state stays one step or the other: a non-finite stop in the middle of an update,
the critic's non-finite guard across a checkpoint, and the engine's dtype on resume."""

from __future__ import annotations

import math

import pytest
import torch
from learner_helpers import built, snapshot
from safetensors.torch import load_file

from polyrl.engines.base import RolloutEngine
from polyrl.learner.nonfinite import NonFiniteTrainingError
from polyrl.trainer.checkpoint import latest_checkpoint, read_checkpoint_info


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


def _count_state_copies(learner) -> dict[str, int]:
    """Counts the learner's full-state reads (what a snapshot of weights and AdamW state makes)."""
    counts = {"policy": 0, "optimizer": 0}
    for name, owner in (("policy", learner.policy), ("optimizer", learner.optimizer)):
        original = owner.state_dict

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        owner.state_dict = counted
    return counts


def test_a_nan_on_the_second_mini_batch_stops_with_the_step_saved_whole_and_nothing_copied(tmp_path, tiny_experiment):
    # 2 mini-batches (one micro-batch each at micro_batch_size 8 of 16 samples), a stop after 1
    # non-finite step: step 2's first mini-batch is applied, its second is NaN and stops the run.
    # The guarantee: the checkpoint is of a whole step. Before, the learner copied its weights and
    # AdamW state before every such update and put them back at the stop (saving step 1); now
    # step 2 ends there, its second optimizer step skipped, and is saved as step 2, with no copy.
    config = tiny_experiment(train={"steps": 4, "mini_batches": 2, "max_consecutive_nonfinite": 1}, checkpoint={"every": 10})
    with built(tmp_path, config) as arm:
        loop = arm.loop(printer=lambda line: None)
        loop.step()
        assert arm.learner.optimizer_step == 2
        _nan_on_call(arm.learner, 2)
        learner = arm.learner
        copies, update = _count_state_copies(learner), learner.update
        during_update: dict[str, int] = {}

        def watched_update(*args, **kwargs):
            try:
                return update(*args, **kwargs)
            finally:
                during_update.update(copies)

        learner.update = watched_update
        with pytest.raises(
            NonFiniteTrainingError, match=r"training stopped in step 2: .*Step 2 is saved as done in .*step_000002"
        ):
            loop.step()
        assert during_update == {"policy": 0, "optimizer": 0}  # no snapshot of the weights or AdamW state
        # Step 2's first optimizer step applied, its second skipped: 3 applied in all.
        assert learner.optimizer_step == 3
        after_stop = snapshot(learner.policy)
        moments = _adam_moments(learner.optimizer)
    checkpoint = latest_checkpoint(tmp_path / "runs" / "main")
    info = read_checkpoint_info(checkpoint)
    assert checkpoint.name == "step_000002" and info["step"] == 2 and info["optimizer_step"] == 3
    assert info["nonfinite"] == {"consecutive": 0} and info["stopped"] == "non-finite policy loss"
    # The weights and AdamW moments saved are those of the learner after the stop (one whole step).
    saved = load_file(str(checkpoint / "policy.safetensors"))
    assert all(torch.equal(saved[name], after_stop[name]) for name in after_stop)
    saved_moments = load_file(str(checkpoint / "policy_optimizer.safetensors"))
    assert all(
        torch.equal(saved_moments[f"{i}.{key}"], learner.optimizer.state[p][key])
        for i, p in enumerate(learner.policy.parameters())
        for key in ("exp_avg", "exp_avg_sq")
    )
    assert moments and all(torch.equal(a, b) for a, b in zip(moments, _adam_moments(learner.optimizer)))
    # A resume starts at step 3: nothing of step 2 is trained twice.
    with built(tmp_path, config, resume=True) as resumed:
        assert resumed.start_step == 2 and resumed.learner.optimizer_step == 3


def test_a_nan_on_the_first_mini_batch_saves_the_previous_step(tmp_path, tiny_experiment):
    # No optimizer step of step 2 applied: the learner is as after step 1, saved as step 1 with the
    # data position of step 2's start (a resume repeats step 2).
    config = tiny_experiment(train={"steps": 4, "mini_batches": 2, "max_consecutive_nonfinite": 1}, checkpoint={"every": 10})
    with built(tmp_path, config) as arm:
        loop = arm.loop(printer=lambda line: None)
        loop.step()
        after_step_1 = snapshot(arm.learner.policy)
        _nan_on_call(arm.learner, 1)
        with pytest.raises(NonFiniteTrainingError, match=r"training stopped in step 2: .*last good weights are saved in"):
            loop.step()
        assert all(torch.equal(after_step_1[name], p) for name, p in arm.learner.policy.named_parameters())
        assert arm.learner.optimizer_step == 2
    checkpoint = latest_checkpoint(tmp_path / "runs" / "main")
    assert checkpoint.name == "step_000001" and read_checkpoint_info(checkpoint)["optimizer_step"] == 2


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
