"""The loop alone, over recording stand-ins for the roles (a unit test of the order of phases and
of what the hooks receive; the real roles train together in tests/training/test_trainer.py)."""

from __future__ import annotations

import json

import pytest
import torch

from polyrl.core.types import Completion, PromptSample
from polyrl.learner.nonfinite import NonFiniteStop, NonFiniteTrainingError
from polyrl.learner.policy_learner import LearnerSettings
from polyrl.rollout.batches import Rollout, Scores
from polyrl.rollout.collector import Collected
from polyrl.trainer.hooks import Checkpointer, Hook
from polyrl.trainer.loop import TrainingLoop


class Roles:
    """Sampler, collector, pipeline and learner in one recorder."""

    def __init__(self, fail_update: bool = False):
        self.calls: list[str] = []
        self.position = 0
        self.fail_update = fail_update
        self.settings = LearnerSettings(aggregation="token_mean", max_consecutive_nonfinite=2)
        self.engine = None  # the collector's engine (protocols.Collector): none here, so no weights to release

    def state_dict(self):
        return {"position": self.position}

    def collect(self, step):
        self.calls.append("collect")
        self.position += 1
        completions = [
            Completion(prompt_ids=[1], completion_ids=[2, 3], text="ab", sampling_logprobs=[-1.0, -1.0], finish_reason="stop")
        ]
        return Collected(
            Rollout([PromptSample(prompt="q")], completions, torch.tensor([0])),
            Scores([0.5], {"reward/mean": 0.5}),
            {"generate": 0.25, "score": 0.5},
        )

    def run(self, rollout, scores):
        self.calls.append("pipeline")
        return type("Batch", (), {"metrics": {"advantage/mean": 0.0}})()

    def update(self, batch, step_index):
        self.calls.append("learn")
        if self.fail_update:
            raise NonFiniteStop("grad_norm", 2)
        return {"actor/loss": 1.0}

    def weights(self, dtype):
        return iter([("w", torch.zeros(1, dtype=dtype))])

    def sync_weights(self, named):
        self.calls.append(f"sync:{[t.dtype for _, t in named]}")


class Recorder(Hook):
    def __init__(self, calls):
        self.calls, self.reports = calls, []

    def observe(self, report):
        self.calls.append("observe")
        report.metrics["hook/seen"] = 1.0

    def publish(self, report):
        self.calls.append("publish")
        self.reports.append(report)


def _loop(tmp_path, roles, **kwargs):
    model = torch.nn.Linear(1, 1)
    checkpointer = Checkpointer(
        tmp_path,
        every=10,
        keep=2,
        last_step=2,
        models={"policy": model},
        optimizers={},
        state=lambda: {"sampler": roles.state_dict()},
    )
    recorder = Recorder(roles.calls)
    loop = TrainingLoop(
        arm="a",
        steps=2,
        sampler=roles,
        collector=roles,
        pipeline=roles,
        learner=roles,
        engine_dtype=torch.bfloat16,
        checkpointer=checkpointer,
        hooks=[recorder],
        **kwargs,
    )
    return loop, recorder


def test_a_step_runs_collect_pipeline_learn_sync_then_the_hooks_with_plain_data(tmp_path):
    roles = Roles()
    loop, recorder = _loop(tmp_path, roles)
    history = loop.run()
    assert roles.calls == ["collect", "pipeline", "learn", "sync:[torch.bfloat16]", "observe", "publish"] * 2
    assert len(history) == 2 and loop.step_index == 2
    report = recorder.reports[0]
    assert report.step == 1 and report.samples == [
        {"prompt": "q", "completion": "ab", "reward": 0.5, "length": 2, "finish_reason": "stop", "modalities": "TT"}
    ]
    m = history[0]
    assert m["hook/seen"] == 1.0 and m["actor/loss"] == 1.0 and m["rollout/samples"] == 1.0
    assert (m["perf/generate_s"], m["perf/score_s"]) == (0.25, 0.5) and m["perf/step_s"] >= 0.75


def test_a_non_finite_stop_saves_the_last_good_weights_with_the_step_start_position(tmp_path):
    roles = Roles(fail_update=True)
    loop, _ = _loop(tmp_path, roles, start_step=3)
    with pytest.raises(
        NonFiniteTrainingError,
        match=r"arm 'a': training stopped in step 4: 2 optimizer steps in a row had a "
        r"non-finite \(NaN/inf\) policy gradient norm",
    ):
        loop.step()
    info = json.loads((tmp_path / "step_000003" / "checkpoint.json").read_text())
    # the sampler had moved to 1 by generation; the checkpoint keeps the position before it (0)
    assert info["sampler"] == {"position": 0} and info["nonfinite"] == {"consecutive": 0}
    assert info["stopped"] == "non-finite policy gradient norm"
