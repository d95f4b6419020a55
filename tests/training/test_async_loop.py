"""Asynchronous, off-policy training (rollout.max_staleness, polyrl/trainer/async_loop.py): the
staleness bound and its histogram, lock-step equality with the synchronous loop, learning at
k = 1, the behaviour policy in the ratio, and a resume that loses and repeats no prompt."""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import replace

import pytest
import torch

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.config.tracking import HealthConfig
from polyrl.modeling.logprobs import token_logprobs
from polyrl.monitoring.health import HealthMonitor
from polyrl.trainer.async_loop import RolloutBuffer, staleness_metrics
from polyrl.trainer.build_arm import build_arm
from polyrl.trainer.hooks import Callback

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]


def _arm(tmp_path, config_dict, *, resume=False, folder="runs"):
    config = resolve_arms(config_dict)["main"]
    return build_arm(config, arm="main", arm_dir=tmp_path / folder / "main", resume=resume)


def _async_config(tiny_experiment, k=1, **train):
    return tiny_experiment(
        rollout={"max_staleness": k}, train={"steps": 6, "learning_rate": 1e-2, "micro_batch_size": 8, **train}
    )


# --- light: the bound, the histogram, the buffer, the config and the health checks -----------


def test_staleness_histogram_counts_each_value_and_refuses_beyond_the_bound():
    # Trained at version 5 with k = 2: samples of versions 5, 4, 4, 3 are 0, 1, 1, 2 versions old;
    # mean (0 + 1 + 1 + 2) / 4 = 1.0.
    metrics = staleness_metrics([5, 4, 4, 3], trained_at=5, max_staleness=2)
    assert metrics == {
        "async/staleness/0": 1.0,
        "async/staleness/1": 2.0,
        "async/staleness/2": 1.0,
        "async/staleness_mean": 1.0,
        "async/staleness_max": 2.0,
    }
    with pytest.raises(RuntimeError, match=r"samples 0..3 policy versions old.*max_staleness is 2"):
        staleness_metrics([5, 2], trained_at=5, max_staleness=2)
    with pytest.raises(RuntimeError, match="without a policy version"):
        staleness_metrics([5, None], trained_at=5, max_staleness=2)


def test_buffer_reports_utilisation_and_hands_a_producer_error_to_the_learner():
    from polyrl.trainer.async_loop import BufferedBatch

    buffer = RolloutBuffer(max_staleness=2, version=0)
    for step in (1, 2):
        buffer.put(BufferedBatch(step, collected=None, sampler_before={}, sampler_after={}, engine_wait_s=0.0))
    batch, utilisation, _ = buffer.take(1)
    assert batch.step == 1 and utilisation == 1.0  # two finished batches over k = 2 slots
    _, utilisation, _ = buffer.take(2)
    assert utilisation == 0.5  # one over two
    assert buffer.wait_for_version(0) is not None
    buffer.fail(ValueError("engine died"))
    with pytest.raises(RuntimeError, match="rollout producer failed.*engine died"):
        buffer.take(3)


def test_each_worker_partition_holds_its_own_steps_and_the_learner_draws_them_round_robin():
    from polyrl.trainer.async_loop import BufferedBatch
    from polyrl.trainer.async_partitions import partition_of, worker_groups

    # Two partitions: steps 1, 3 to partition 0 and steps 2, 4 to partition 1 ((t - 1) mod 2).
    assert [partition_of(step, 2) for step in (1, 2, 3, 4)] == [0, 1, 0, 1]
    # At most k + 1 steps are collected at once, so min(N, k + 1) partitions of contiguous workers:
    # 4 workers at k = 1 -> 2 partitions of 2; at k = 3 -> one worker each; k = 0 -> one of all; 3 at k = 1 -> 2 + 1.
    assert worker_groups(4, 1) == [[0, 1], [2, 3]] and worker_groups(4, 3) == [[0], [1], [2], [3]]
    assert worker_groups(4, 0) == [[0, 1, 2, 3]] and worker_groups(3, 1) == [[0, 1], [2]] and worker_groups(1, 2) == [[0]]
    buffer = RolloutBuffer(max_staleness=3, version=0, partitions=2)
    for step in (2, 4, 1):
        buffer.put(
            BufferedBatch(
                step, collected=None, sampler_before={}, sampler_after={}, engine_wait_s=0.0, partition=partition_of(step, 2)
            )
        )
    assert [sorted(p) for p in buffer.partitions] == [[1], [2, 4]] and buffer.held() == [1, 2]
    batch, utilisation, _ = buffer.take(2)
    assert (batch.step, batch.partition, utilisation) == (2, 1, 1.0)  # 3 finished over 3 slots
    assert buffer.held() == [1, 1] and buffer.pending_steps() == [1, 4]


def test_partition_producers_draw_their_prompts_in_step_order():
    import threading

    from polyrl.core.types import PromptSample
    from polyrl.data.sampler import PromptSampler
    from polyrl.trainer.async_partitions import DrawsClosed, OrderedDraws

    sampler = PromptSampler([PromptSample(prompt=str(i)) for i in range(10)], seed=0)
    expected = PromptSampler([PromptSample(prompt=str(i)) for i in range(10)], seed=0)
    first, second = [p.prompt for p in expected.next_batch(3)], [p.prompt for p in expected.next_batch(3)]
    draws = OrderedDraws(sampler, first_step=1, one_draw_per_step=True)
    got: dict[int, tuple] = {}

    def collect(step):
        before = draws.begin(step)
        prompts = [p.prompt for p in draws.draw(3)]
        got[step] = (before["index"], prompts, draws.end(step)["index"])

    late = threading.Thread(target=collect, args=(2,))
    late.start()  # step 2's producer asks first: it must wait for step 1's draw
    time.sleep(0.2)
    assert 2 not in got
    collect(1)
    late.join(timeout=10)
    assert got == {1: (0, first, 3), 2: (3, second, 6)}
    draws.close()
    with pytest.raises(DrawsClosed):  # a producer waiting for its turn when the loop ends stops
        draws.begin(5)


@pytest.mark.parametrize(
    "rollout, fragment",
    [
        ({"max_staleness": 1, "top_p": 0.9}, "top_p < 1 renormalises"),
        ({"max_staleness": 1, "threads": 1}, "process-wide thread count"),
        ({"max_staleness": -1}, "greater than or equal to 0"),
    ],
)
def test_combinations_that_cannot_work_are_refused_with_the_field_path(tiny_experiment, rollout, fragment):
    with pytest.raises(ConfigError) as caught:
        resolve_arms(tiny_experiment(rollout=rollout))
    assert "rollout.max_staleness" in str(caught.value) and fragment in str(caught.value), str(caught.value)


def test_buffer_utilisation_and_communication_health_checks_use_running_means():
    monitor = HealthMonitor(HealthConfig(), check_overlap=True)
    # Utilisation 1, 0.5, 0 -> running means 1.0, 0.75, 0.5; checked from the third report: 0.5 < 0.7.
    # Sync share 0.1, 0.1, 0.3 -> means 0.1, 0.1, 0.5/3 = 0.167 > 0.15 at the third.
    warnings = [
        monitor.check(step, {"async/buffer_utilisation": u, "perf/sync_share": c})
        for step, (u, c) in enumerate([(1.0, 0.1), (0.5, 0.1), (0.0, 0.3)], start=1)
    ]
    assert warnings[0] == warnings[1] == []
    assert [w.split(":")[0] for w in warnings[2]] == ["buffer_utilisation", "communication"]
    assert "50% < 70%" in warnings[2][0] and "17% of a step > 15%" in warnings[2][1]
    assert (
        HealthMonitor(HealthConfig()).check(1, {"async/buffer_utilisation": 0.0, "perf/sync_share": 0.9}) == []
    )  # synchronous: off


# --- heavy: real roles on the tiny policy (hf engine) --------------------------------------------


def _parameters(arm):
    return {name: p.detach().clone() for name, p in arm.learner.policy.named_parameters()}


@pytest.mark.slow
def test_lock_step_async_machinery_equals_the_synchronous_loop_bit_for_bit(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8})
    results = []
    for folder, k in (("sync", None), ("lockstep", 0)):
        arm = _arm(tmp_path, config, folder=folder)
        try:
            history = arm.loop(max_staleness=k).run()
            results.append((_parameters(arm), history))
        finally:
            arm.close()
    (synchronous, sync_history), (lockstep, lock_history) = results
    assert all(torch.equal(synchronous[name], lockstep[name]) for name in synchronous)
    assert [h["reward/mean"] for h in sync_history] == [h["reward/mean"] for h in lock_history]
    assert all(h["async/staleness/0"] == h["rollout/samples"] for h in lock_history)  # k = 0: every sample fresh


@pytest.mark.slow
def test_staleness_one_trains_the_demo_task_upward_within_the_bound(tmp_path, tiny_experiment):
    arm = _arm(tmp_path, _async_config(tiny_experiment, k=1, steps=8))
    try:
        before = _parameters(arm)
        history = arm.loop().run()
    finally:
        arm.close()
    assert len(history) == 8 and all(math.isfinite(h["actor/loss"]) for h in history)
    assert any(not torch.equal(before[name], p) for name, p in _parameters(arm).items())
    for h in history:
        assert h["async/staleness_max"] <= 1 and h["async/staleness/0"] + h["async/staleness/1"] == h["rollout/samples"]
        assert {"perf/wait_for_data_s", "perf/engine_wait_s", "perf/sync_share"} <= set(h)
    assert "async/buffer_utilisation" not in history[0] and "async/buffer_utilisation_mean" in history[-1]
    assert sum(h["async/staleness/1"] for h in history) > 0  # generation did run ahead of the learner
    first, last = history[:2], history[-2:]
    mean = lambda rows: sum(h["reward/mean"] for h in rows) / len(rows)  # noqa: E731
    assert mean(last) > mean(first) + 0.01, (mean(first), mean(last))


@pytest.mark.slow
def test_the_ratio_uses_the_behaviour_policy_of_a_stale_sample(tmp_path, tiny_experiment):
    arm = _arm(tmp_path, _async_config(tiny_experiment, k=1, steps=2))
    try:
        stale = arm.collector.collect(1)  # sampled by version 0
        fresh = arm.collector.collect(2)
        arm.learner.update(arm.pipeline.run(fresh.rollout, fresh.scores), 0)  # the learner moves on to version 1
        batch = arm.pipeline.run(stale.rollout, stale.scores)
        assert torch.equal(batch.old_logprobs, batch.packed.sampling_logprobs)
        mask = batch.loss_mask
        with torch.no_grad():
            current, _ = token_logprobs(arm.learner.policy, batch.packed)
        expected = float((torch.exp(current - batch.old_logprobs) * mask).sum() / mask.sum())
        # What today's synchronous π_old would give on the same stale batch: the update's own first pass.
        synchronous = replace(arm.pipeline.context, behaviour_logprobs=False, reuse_old_logprobs=True)
        on_policy_batch = type(arm.pipeline)(synchronous).run(stale.rollout, stale.scores)
        learner = arm.learner
        # The learner as it is, to start the second update from the same place.
        saved = copy.deepcopy((learner.policy.state_dict(), learner.optimizer.state_dict(), learner.optimizer_step))
        metrics = learner.update(batch, 1)  # one mini-batch: the first one sees the stale ratio
        learner.policy.load_state_dict(saved[0])
        learner.optimizer.load_state_dict(saved[1])
        learner.optimizer_step = saved[2]
        on_policy = arm.learner.update(on_policy_batch, 1)
    finally:
        arm.close()
    assert abs(metrics["actor/ratio_mean"] - expected) < 1e-4, (metrics["actor/ratio_mean"], expected)
    assert metrics["actor/ratio_max"] > 1.01 or metrics["actor/ratio_min"] < 0.99
    assert on_policy["actor/ratio_min"] == on_policy["actor/ratio_max"] == 1.0  # the silently wrong ratio it replaces


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_an_async_resume_loses_and_repeats_no_prompt(tmp_path, tiny_experiment):
    config = _async_config(tiny_experiment, k=1, steps=6)
    config["checkpoint"]["every"] = 1
    group = config["rollout"]["samples_per_prompt"]
    drawn_at_interrupt: list[int] = []

    def consumed_by(arm, record, stop_after=None):
        class Record(Callback):
            def publish(self, report):
                record.append([p.prompt for p in report.prompts[::group]])
                if report.step == stop_after:
                    # Interrupt only once the producer has drawn step 4's prompts (it starts as soon as
                    # version 2 is synced), so that the interruption finds a batch in flight.
                    deadline = time.monotonic() + 60
                    while arm.sampler.state_dict()["index"] <= 12 and time.monotonic() < deadline:
                        time.sleep(0.01)
                    drawn_at_interrupt.append(arm.sampler.state_dict()["index"])
                    raise Interrupted(report.step)

        loop = arm.loop()
        loop.hooks.append(Record(lambda *_: None))
        return loop.run()

    straight: list[list[str]] = []
    arm = _arm(tmp_path, config, folder="straight")
    try:
        consumed_by(arm, straight)
    finally:
        arm.close()

    interrupted: list[list[str]] = []
    arm = _arm(tmp_path, config, folder="killed")
    try:
        with pytest.raises(Interrupted):
            consumed_by(arm, interrupted, stop_after=3)
    finally:
        arm.close()
    info = json.loads((tmp_path / "killed" / "main" / "step_000003" / "checkpoint.json").read_text())
    # The position after the 3 consumed batches of 4 prompts, though the producer had drawn step 4 (and maybe 5).
    assert info["sampler"]["index"] == 12 and drawn_at_interrupt[0] > 12
    assert set(info["async_in_flight"]) <= {4, 5}
    arm = _arm(tmp_path, config, folder="killed", resume=True)
    try:
        assert arm.start_step == 3
        consumed_by(arm, interrupted)
    finally:
        arm.close()
    assert len(straight) == len(interrupted) == 6
    assert interrupted == straight


@pytest.mark.slow
def test_vllm_generates_ahead_under_the_engine_lock_within_the_bound(tmp_path, tiny_experiment):
    config = _async_config(tiny_experiment, k=2, steps=4)
    config["rollout"].update(engine="vllm", kv_cache_gb=0.25)
    arm = _arm(tmp_path, config)
    try:
        before = _parameters(arm)
        history = arm.loop().run()
    finally:
        arm.close()
    assert any(not torch.equal(before[name], p) for name, p in _parameters(arm).items())
    for step, h in enumerate(history, start=1):
        assert math.isfinite(h["actor/loss"]) and h["async/staleness_max"] <= min(2, step - 1)
        assert sum(h[f"async/staleness/{v}"] for v in range(3)) == h["rollout/samples"]
