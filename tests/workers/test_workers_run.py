"""A training run with ``rollout.workers: 2`` (and ``ppl_fluency`` scoring in a Ray actor) trains
exactly as the in-process run: same samples, rewards and updates step after step, which needs the
weights to reach both workers after every update. And a remote reward module scores as the local one."""

from __future__ import annotations

import math

import pytest

from polyrl.config.schema import ExperimentConfig
from polyrl.rewards import CompositeReward, RewardBatch
from polyrl.trainer.build_arm import build_arm

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm, pytest.mark.ray]


def train(config: dict, arm_dir) -> tuple[list[dict[str, float]], list[list[int]], str]:
    arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=arm_dir)
    samples: list[list[int]] = []
    try:
        loop = arm.loop(printer=lambda _: None)
        generate = arm.collector.generate

        def recorded(*args, **kwargs):
            rollout = generate(*args, **kwargs)
            samples.extend(c.completion_ids for c in rollout.completions)
            return rollout

        arm.collector.generate = recorded
        history = loop.run()
        engine = type(arm.collector.engine).__name__
    finally:
        arm.close()
    return history, samples, engine


@pytest.mark.slow
def test_two_workers_and_a_remote_reward_train_as_the_in_process_run(ray_cluster, tiny_experiment, tmp_path):
    rewards = [
        {"module": "length", "params": {"unit": "chars"}},
        {"module": "ppl_fluency", "weight": 0.1, "params": {"tau": 1.0}},
    ]
    base = tiny_experiment(train={"steps": 2}, rewards=rewards)
    local, local_samples, local_engine = train(base, tmp_path / "one")
    remote_rewards = [rewards[0], {**rewards[1], "remote": {"num_cpus": 0.5}}]
    spread, spread_samples, spread_engine = train(
        {**base, "rollout": {**base["rollout"], "workers": 2}, "rewards": remote_rewards}, tmp_path / "two"
    )
    assert (local_engine, spread_engine) == ("HFRolloutEngine", "RolloutWorkerPool")
    assert len(local_samples) == len(spread_samples) == 2 * 4 * 4
    assert spread_samples == local_samples  # step 2 samples with the weights of update 1 on both workers
    assert [h["rollout/policy_version"] for h in spread] == [h["rollout/policy_version"] for h in local] == [0.0, 1.0]
    assert spread[-1]["rollout/workers/restarts"] == 0.0 and spread[-1]["rollout/workers/resyncs"] == 0.0
    for mine, theirs in zip(spread, local):
        for key in ("reward/mean", "reward/ppl_fluency/mean", "actor/loss", "actor/grad_norm", "rollout/logprob_gap"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key


def test_a_remote_reward_module_scores_as_the_local_one(ray_cluster, random_policy_dir):
    spec = {"module": "ppl_fluency", "params": {"model_path": str(random_policy_dir), "tau": 1.0}}
    batch = RewardBatch(prompts=["12+7=", "hello", ""], completions=["19", "world wide", "abc"])
    local = CompositeReward([spec]).score(batch)
    remote = CompositeReward([{**spec, "remote": True}])
    try:
        assert type(remote.modules["ppl_fluency"]).__name__ == "RemoteRewardModule"
        scored = remote.score(batch)
    finally:
        remote.close()
    assert remote.modules["ppl_fluency"].actor is None
    assert scored.per_module["ppl_fluency"] == pytest.approx(local.per_module["ppl_fluency"], rel=1e-6)
    assert all(value is not None and value < 0 for value in scored.per_module["ppl_fluency"])  # a random model is far above tau 1


@pytest.mark.slow
def test_async_workers_collect_whole_steps_into_their_own_buffer_partitions(ray_cluster, tiny_experiment, tmp_path):
    """rollout.workers 2 with max_staleness 2: worker (t - 1) mod 2 collects step t whole, into its
    partition; the steps get the prompts of the synchronous in-process run, in order, and step 1
    (always sampled by version 0) its very samples."""
    from polyrl.trainer.hooks import Callback

    def run(config, folder):
        arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=tmp_path / folder)
        seen: list[tuple[list[str], list[str]]] = []

        class Record(Callback):
            def publish(self, report):
                seen.append(([p.prompt for p in report.prompts], [row["completion"] for row in report.samples]))

        try:
            before = {name: p.detach().clone() for name, p in arm.learner.policy.named_parameters()}
            loop = arm.loop(printer=lambda _: None)
            loop.hooks.append(Record(lambda *_: None))
            history = loop.run()
            changed = any(not p.detach().equal(before[name]) for name, p in arm.learner.policy.named_parameters())
            engine = getattr(loop, "engine", None)  # the asynchronous loop's: one versioned engine per worker
            engines = [getattr(part.engine, "batches", None) for part in engine.partitions] if engine is not None else []
        finally:
            arm.close()
        return history, seen, changed, engines

    base = tiny_experiment(train={"steps": 4, "learning_rate": 1e-2})
    _, reference, _, _ = run(base, "sync")
    history, seen, changed, batches = run({**base, "rollout": {**base["rollout"], "workers": 2, "max_staleness": 2}}, "async")
    assert batches == [2, 2]  # each worker generated two whole steps
    assert [h["async/partition"] for h in history] == [0.0, 1.0, 0.0, 1.0]
    assert all({"async/partition_0/batches", "async/partition_1/batches"} <= set(h) for h in history)
    assert [prompts for prompts, _ in seen] == [prompts for prompts, _ in reference]  # step order kept across the workers
    assert seen[0][1] == reference[0][1]
    assert changed and all(math.isfinite(h["actor/loss"]) for h in history)
    for step, h in enumerate(history, start=1):
        assert h["async/staleness_max"] <= min(2, step - 1)
        assert sum(h[f"async/staleness/{v}"] for v in range(3)) == h["rollout/samples"]
