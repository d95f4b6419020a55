"""A run with 2 data-parallel learner ranks (real Ray actors, gloo) through the arm's set-up: its
checkpoint resumes on 1 rank (and back on 2) where an uninterrupted 2-rank run would be."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from learner_helpers import built, snapshot

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.learner.ranks import DataParallelLearner
from polyrl.trainer.checkpoint import read_checkpoint_info


def _config(tiny_experiment, workers: int) -> dict:
    # PPO: a critic whose weights and AdamW state must cross the checkpoint too; lr 1e-4 keeps
    # AdamW's float-noise amplification below the tolerance (tests/training/test_learner_ranks.py).
    return tiny_experiment(
        objective={"name": "ppo"},
        train={
            "steps": 3,
            "learning_rate": 1e-4,
            "micro_batch_size": 4,
            "learner_workers": workers,
            "value": {"learning_rate": 1e-4},
        },
        checkpoint={"every": 2},
    )


def _weights(arm) -> dict[str, torch.Tensor]:
    return {
        **{f"policy.{k}": v for k, v in snapshot(arm.learner.policy).items()},
        **{f"critic.{k}": v for k, v in snapshot(arm.critic.model).items()},
    }


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rel: float) -> bool:
    return all(float((a[k] - b[k]).norm()) <= rel * float(a[k].norm()) + 1e-12 for k in a)


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank_and_on_two(ray_local, tmp_path, tiny_experiment):
    # 3 steps on 2 ranks, with the checkpoint of step 2 kept aside.
    folder = tmp_path / "run"
    checkpoints = folder / "runs" / "main"
    with built(folder, _config(tiny_experiment, 2)) as arm:
        assert isinstance(arm.learner, DataParallelLearner) and arm.learner.world_size == 2
        start = _weights(arm)
        loop = arm.loop(printer=lambda _: None)
        history = [loop.step(), loop.step()]
        assert read_checkpoint_info(checkpoints / "step_000002")["optimizer_step"] == 2
        shutil.copytree(checkpoints / "step_000002", tmp_path / "step_000002")
        history.append(loop.step())
        straight = _weights(arm)
    assert all(math.isfinite(step["actor/loss"]) and math.isfinite(step["value/loss"]) for step in history)
    assert not _close(start, straight, 1e-4)  # trained

    # Step 3 again from the step-2 checkpoint, on 1 rank, then on 2.
    for workers in (1, 2):
        shutil.rmtree(checkpoints)
        shutil.copytree(tmp_path / "step_000002", checkpoints / "step_000002")
        with built(folder, _config(tiny_experiment, workers), resume=True) as arm:
            assert arm.start_step == 2 and isinstance(arm.learner, DataParallelLearner) == (workers == 2)
            assert arm.learner.optimizer.state and arm.critic.optimizer.state  # AdamW moments came back
            metrics = arm.loop(printer=lambda _: None).step()
            assert metrics["actor/optimizer_steps"] == 3.0
            # As the uninterrupted run, up to float summation order (1 rank vs 2).
            assert _close(straight, _weights(arm), 1e-5), workers


@pytest.mark.slow
def test_a_one_rank_checkpoint_resumes_on_two_ranks(ray_local, tmp_path, tiny_experiment):
    # 3 steps in one process, the checkpoint of step 2 kept aside; then step 3 again from it on 2 ranks.
    folder = tmp_path / "run"
    checkpoints = folder / "runs" / "main"
    with built(folder, _config(tiny_experiment, 1)) as arm:
        assert not isinstance(arm.learner, DataParallelLearner)
        loop = arm.loop(printer=lambda _: None)
        loop.step(), loop.step()
        shutil.copytree(checkpoints / "step_000002", tmp_path / "step_000002")
        loop.step()
        straight = _weights(arm)
    shutil.rmtree(checkpoints)
    shutil.copytree(tmp_path / "step_000002", checkpoints / "step_000002")
    with built(folder, _config(tiny_experiment, 2), resume=True) as arm:
        assert arm.start_step == 2 and isinstance(arm.learner, DataParallelLearner) and arm.learner.world_size == 2
        metrics = arm.loop(printer=lambda _: None).step()
        assert metrics["actor/optimizer_steps"] == 3.0 and math.isfinite(metrics["actor/loss"])
        resumed = _weights(arm)
        states = arm.learner.ranks.call("full_state", False)  # rank 0 its state; rank 1 None
    assert states[1] is None and all(torch.equal(states[0]["policy"][k], v) for k, v in snapshot(arm.learner.policy).items())
    assert _close(straight, resumed, 1e-5)  # AdamW moments and critic crossed from 1 rank to 2


@pytest.mark.parametrize(
    "clash, message",
    [
        ({"model": {"lora": {"r": 4}}}, "model.lora"),
        ({"train": {"compile": True}}, "train.compile: true"),
        ({"train": {"share_prompts": True}}, "train.share_prompts: true"),
    ],
)
def test_settings_the_ranks_do_not_build_are_refused(tiny_experiment, clash, message):
    config = tiny_experiment(train={"learner_workers": 2})
    for section, values in clash.items():
        config.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=rf"train.learner_workers.*{message}.*allowed here: learner_workers: 1"):
        resolve_arms(config)
    with pytest.raises(ConfigError, match=r"train.learner_workers"):
        resolve_arms(tiny_experiment(train={"learner_workers": 0}))


@pytest.mark.slow  # a local Ray cluster, two rank actors and a 3-step run: not the quick tier
def test_asynchronous_training_on_two_learner_ranks(ray_local, tmp_path, tiny_experiment):
    """rollout.max_staleness 1 with train.learner_workers 2: the producer generates ahead while
    the ranks update; the engine ends with the ranks' weights (the mirror's), within the bound."""
    config = tiny_experiment(
        rollout={"max_staleness": 1}, train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 4, "learner_workers": 2}
    )
    with built(tmp_path, config) as arm:
        assert isinstance(arm.learner, DataParallelLearner) and arm.learner.world_size == 2
        start = snapshot(arm.learner.policy)
        history = arm.loop(printer=lambda _: None).run()
        rank0 = arm.learner.ranks.call("full_state", False)[0]["policy"]
        engine_model = arm.collector.engine.engine.model  # VersionedEngine around the in-process hf engine
        engine_weights = {name: p.detach().clone() for name, p in engine_model.named_parameters()}
        mirror = snapshot(arm.learner.policy)
    assert len(history) == 3 and all(math.isfinite(h["actor/loss"]) for h in history)
    assert not _close(start, mirror, 1e-4)  # trained
    assert all(torch.equal(mirror[name], rank0[name]) for name in mirror)  # the mirror is rank 0
    assert all(torch.equal(engine_weights[name], mirror[name]) for name in engine_weights)  # the last sync reached the engine
    for step, h in enumerate(history, start=1):
        assert h["async/staleness_max"] <= min(1, step - 1)
        assert h["async/staleness/0"] + h["async/staleness/1"] == h["rollout/samples"]
