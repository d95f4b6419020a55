"""The loop's seams (polyrl/trainer/protocols.py) against the roles that fill them: every member a
protocol names exists on each implementation, and its methods take the protocol's parameters,
so a rename on either side fails here rather than deep inside a training run."""

from __future__ import annotations

import inspect

import pytest
import torch

from polyrl.core.types import PromptSample
from polyrl.data.sampler import PromptSampler
from polyrl.engines.base import RolloutEngine
from polyrl.engines.worker_pool import RolloutWorkerPool, WorkerEngine
from polyrl.evals.periodic import PeriodicEvaluator, PeriodicResult
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.learner.ranks import DataParallelLearner
from polyrl.rewards import CompositeReward
from polyrl.rollout.collector import CollectSettings, RolloutCollector
from polyrl.tracking.run_logger import RunLogger
from polyrl.trainer import protocols
from polyrl.trainer.async_loop import VersionedEngine
from polyrl.trainer.inspector_hook import InspectorHook
from polyrl.trainer.pipeline import BatchPipeline

_TYPING = {"_is_protocol", "_is_runtime_protocol", "__protocol_attrs__", "__non_callable_proto_members__"}


def members(protocol: type) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)
    return (names | ({"__call__"} if "__call__" in vars(protocol) else set())) - _TYPING


def parameters(fn: object, *, required_only: bool = False) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.name != "self" and not (required_only and p.default is not inspect.Parameter.empty)
    ]


def mismatches(protocol: type, implementation: object) -> list[str]:
    """The protocol's members ``implementation`` lacks, and methods that do not take the
    protocol's parameters (by name, in order; an implementation may add ones with defaults)."""
    wrong = []
    for name in sorted(members(protocol)):
        if not hasattr(implementation, name):
            wrong.append(f"{name}: missing")
            continue
        wanted = vars(protocol).get(name)
        if inspect.isfunction(wanted):
            got = getattr(type(implementation) if not isinstance(implementation, type) else implementation, name)
            # The protocol's parameters first, by name; any more must have defaults.
            if parameters(got)[: len(parameters(wanted))] != parameters(wanted) or len(parameters(got, required_only=True)) > len(
                parameters(wanted)
            ):
                wrong.append(f"{name}{parameters(got)}: the protocol takes {parameters(wanted)}")
    return wrong


def test_the_member_lister_sees_methods_properties_and_attributes():
    assert members(protocols.Collector) == {"engine", "rewards", "settings", "collect", "sync_weights", "sync_adapter", "close"}
    assert members(protocols.Evaluator) == {"__call__"}
    assert "settings" in members(protocols.Learner) and "labels" in members(protocols.Rewards)

    class Half:
        def collect(self, stepp):  # a renamed parameter
            return None

    assert mismatches(protocols.Collector, Half())[:2] == ["close: missing", "collect['stepp']: the protocol takes ['step']"]


@pytest.fixture
def learner():
    settings = LearnerSettings(aggregation="token_mean")
    return PolicyLearner(torch.nn.Linear(2, 2), object(), settings)


@pytest.mark.parametrize(
    "protocol, implementation",
    [
        (protocols.PromptSource, lambda: PromptSampler([PromptSample(prompt="q")])),
        (protocols.Collector, lambda: RolloutCollector(object(), object(), lambda n: [], CollectSettings(1, 1))),
        (protocols.Pipeline, lambda: BatchPipeline),
        (protocols.Engine, lambda: RolloutEngine),
        (protocols.Engine, lambda: VersionedEngine),
        (protocols.Engine, lambda: RolloutWorkerPool),
        (protocols.WorkerPool, lambda: RolloutWorkerPool),
        (protocols.SyncedEngine, lambda: RolloutEngine),
        (protocols.SyncedEngine, lambda: RolloutWorkerPool),
        (protocols.ReportsWorkerMetrics, lambda: RolloutWorkerPool),
        (protocols.ReportsWorkerMetrics, lambda: WorkerEngine),
        (protocols.ReportsWorkerMetrics, lambda: VersionedEngine),
        (protocols.CapturesTokens, lambda: PolicyLearner),
        (protocols.WantsLearnerTokens, lambda: InspectorHook),
        (protocols.Rewards, lambda: CompositeReward),
        (protocols.Tracker, lambda: RunLogger),
        (protocols.Evaluator, lambda: PeriodicEvaluator),
        (protocols.ChecksOverlap, lambda: PeriodicEvaluator),
        (protocols.EvalOutcome, lambda: PeriodicResult({"a": 1.0})),
        (protocols.Closes, lambda: DataParallelLearner),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_each_role_has_what_its_protocol_names(protocol, implementation):
    assert mismatches(protocol, implementation()) == []


def test_both_learners_have_what_the_loop_uses(learner):
    assert mismatches(protocols.Learner, learner) == []
    # The data-parallel learner: all but write_adapter (model.lora is refused with learner ranks,
    # config/experiment.py, so the loop never asks it for an adapter).
    assert mismatches(protocols.Learner, DataParallelLearner) == ["write_adapter: missing"]
    assert not isinstance(learner, protocols.Closes)  # Arm.close closes only the data-parallel one


def test_the_arm_asks_only_an_evaluator_that_checks_overlap():
    # Arm set-up: data_warnings come from evaluator.overlap_warnings where isinstance(..., ChecksOverlap).
    assert isinstance(PeriodicEvaluator(None), protocols.ChecksOverlap)
    assert not isinstance(lambda engine, step: None, protocols.ChecksOverlap)  # a plain function evaluates only


def test_capabilities_are_asked_with_isinstance_and_a_versioned_engine_answers_itself(learner):
    # The loop asks the learner for per-token values only where it captures them (not the ranks).
    assert isinstance(learner, protocols.CapturesTokens)
    assert not issubclass(DataParallelLearner, protocols.CapturesTokens)

    class Generates:  # an engine that only generates (tests' scripted engines): no worker counters
        def generate(self, prompts, settings):
            return []

        def close(self):
            pass

    assert not isinstance(Generates(), protocols.ReportsWorkerMetrics)
    # A VersionedEngine defines worker_metrics itself ({} around an engine without workers): found
    # by isinstance without its __getattr__, which Python 3.12's protocol check does not follow.
    versioned = VersionedEngine(Generates())
    assert isinstance(versioned, protocols.ReportsWorkerMetrics) and versioned.worker_metrics() == {}
