"""The data-parallel learner (``train.learner_workers: M``): M learner ranks as Ray actors, one
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA), one update.

Shape (verl's and OpenRLHF's actor workers): the driver keeps its :class:`PolicyLearner` as a
*mirror* of rank 0 (the pipeline reads π_old, and the critic's values, from it; the rollout engine
gets its weights; the checkpointer saves it), and M :class:`LearnerRank` actors, placed through a
Ray placement group (one bundle per rank), each hold a learner built from the same
:class:`RankRecipe` and started from the mirror's weights and optimizer state. An update puts the
learner batch in Ray's object store once; every rank reads it, cuts the same shuffled
mini-batches, trains on its shard of each (:mod:`polyrl.runtime.data_parallel`: normaliser counts
and gradients summed over the ranks, clip by the global norm, the critic likewise), and rank 0's
weights come back to the mirror. So the update equals the single-process update on the whole
batch up to float summation order (tested to 1e-6 relative with 2 gloo ranks under a local Ray
cluster: token-level, sequence-level objectives and the PPO critic).

Checkpoints are the single-process format: before a save the mirror takes rank 0's optimizer
states too (:meth:`DataParallelLearner.state_dict`), and a resume pushes the mirror's state to
every rank, so a checkpoint written with M ranks resumes on M' (1 included).

On CUDA each rank takes one GPU and shards its parameters with FSDP2 (``fully_shard`` per decoder
layer, then the root; gradients reduce-scattered as sums); full state dicts are gathered for rank
0 with ``torch.distributed.checkpoint.state_dict``. FSDP2's forwards and backwards are
collectives, so the learner evens its micro-batch counts over the ranks (zero-weight passes on a
rank with fewer) and runs its forwards through the FSDP root (``through_root``). The sharded
learner itself runs in the suite over gloo on the CPU with two processes and gives the
single-process update (tests/training/test_learner_fsdp.py); the CUDA path (NCCL, these Ray actors,
``train.learner_workers`` on GPUs) stays EXPERIMENTAL until it is run on a GPU. The critic's
micro-batch loop (learner/critic.py) is not evened yet, so a critic with sharded (CUDA) ranks is
refused (:func:`start_data_parallel_learner`). The CPU path of ``train.learner_workers`` is plain data parallelism (every rank a
whole replica).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor

from polyrl.algos.objectives import get_objective
from polyrl.core.errors import PolyrlError
from polyrl.engines.image_prompts import auto_model_class
from polyrl.learner.critic import Critic, CriticSettings, build_value_model
from polyrl.learner.nonfinite import NonFiniteStop
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.attention import attend_in_fp32_on_cpu
from polyrl.modeling.gradient_checkpointing import checkpoint_layers
from polyrl.modeling.packing import use_packed_rows_attention
from polyrl.rollout.batches import LearnerBatch
from polyrl.runtime.cpu_matmul import route_linears_through_onednn
from polyrl.runtime.data_parallel import TorchDistributedGroup
from polyrl.runtime.devices import current_cuda_device, use_cuda_device
from polyrl.runtime.fsdp import (
    full_model_state,
    full_optimizer_state,
    load_full_model_state,
    load_full_optimizer_state,
    shard_model,
)
from polyrl.runtime.ray_cluster import acquire_ray, release_ray
from polyrl.runtime.threads import set_torch_threads

__all__ = ["DataParallelLearner", "LearnerRank", "LearnerRanks", "LearnerRanksError", "RankRecipe", "start_data_parallel_learner"]

NONFINITE_KEY = "__nonfinite_stop__"


class LearnerRanksError(PolyrlError):
    """The learner ranks could not be placed or joined (e.g. the Ray cluster lacks the CPUs/GPUs)."""


@dataclass(frozen=True)
class RankRecipe:
    """What a rank builds: the driver's learner set-up, as plain data."""

    policy_path: str
    objective: str
    settings: LearnerSettings
    critic: CriticSettings | None = None
    padding_free: bool = False
    gradient_checkpointing: bool = False
    cpu_matmul: str = "torch"
    threads: int = 1
    cuda: bool = False


# --- one rank (runs in a Ray actor) ----------------------------------------------------------------


def build_rank_learner(recipe: RankRecipe, group: Any) -> PolicyLearner:
    """The learner of one rank, built as :func:`polyrl.trainer.build_arm.build_arm` builds the driver's
    (fp32 master weights, the same attention, checkpointing and GEMM choices)."""
    set_torch_threads(recipe.threads)
    device = current_cuda_device() if recipe.cuda else torch.device("cpu")
    dtype = recipe.settings.compute_dtype
    policy = auto_model_class(recipe.policy_path).from_pretrained(recipe.policy_path, dtype=torch.float32).to(device)
    critic_model = build_value_model(recipe.policy_path, torch.float32).to(device) if recipe.critic is not None else None
    for model, role in ((policy, "policy"), (critic_model, "critic")):
        if model is None:
            continue
        if dtype != torch.float32 and device.type == "cpu":
            attend_in_fp32_on_cpu(getattr(model, "model", model) if role == "critic" else model)
        if recipe.gradient_checkpointing:
            checkpoint_layers(model, role=role)
        if recipe.cpu_matmul == "onednn":
            route_linears_through_onednn(model)
    if recipe.padding_free:
        use_packed_rows_attention(policy)
    if recipe.cuda:
        shard_model(policy)
        if critic_model is not None:
            shard_model(critic_model)
    critic = Critic(critic_model, recipe.critic, group=group) if critic_model is not None else None
    return PolicyLearner(policy, get_objective(recipe.objective), recipe.settings, critic=critic, group=group)


class LearnerRank:
    """One learner rank (the body of a Ray actor): joins the process group, builds its learner,
    loads full states, updates on its shards, and (rank 0) hands its full state back."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.learner: PolicyLearner | None = None
        self.sharded = False

    def address(self) -> tuple[str, int]:
        """A free TCP port on this node, for the process group's rendezvous (rank 0's)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            return host, probe.getsockname()[1]

    def join(self, address: tuple[str, int], backend: str, timeout_s: float) -> int:
        import torch.distributed as dist

        host, port = address
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        if backend == "nccl":
            use_cuda_device(0)  # Ray shows each rank actor its own GPU as device 0
        return os.getpid()

    def build(self, recipe: RankRecipe) -> None:
        self.sharded = recipe.cuda
        self.learner = build_rank_learner(recipe, TorchDistributedGroup(shards_parameters=recipe.cuda))

    def load(self, state: dict[str, Any]) -> None:
        """Weights, optimizer states and counters from the driver's mirror (a start or a resume)."""
        learner = self.learner
        load_full_model_state(learner.policy, state["policy"], self.sharded)
        load_full_optimizer_state(learner.policy, learner.optimizer, state["policy_optimizer"], self.sharded)
        if learner.critic is not None:
            load_full_model_state(learner.critic.model, state["critic"], self.sharded)
            load_full_optimizer_state(learner.critic.model, learner.critic.optimizer, state["critic_optimizer"], self.sharded)
        learner.load_state_dict(state["learner"])
        learner.apply_optimizer_settings()

    def apply_optimizer_settings(self) -> None:
        self.learner.apply_optimizer_settings()

    def update(self, batch: LearnerBatch, step_index: int, weight_version: int | None = None) -> dict[str, Any]:
        try:
            return self.learner.update(batch, step_index, weight_version)
        except NonFiniteStop as stop:  # every rank stops together (the guard sees global values)
            return {NONFINITE_KEY: (stop.reason, stop.consecutive, stop.applied_steps)}

    def full_state(self, optimizers: bool) -> dict[str, Any] | None:
        """Rank 0's full state (weights; optimizer states when ``optimizers``); None on the other
        ranks, which take part only in FSDP2's gathers."""
        learner = self.learner
        state: dict[str, Any] = {"policy": full_model_state(learner.policy, self.sharded), "learner": learner.state_dict()}
        if learner.critic is not None:
            state["critic"] = full_model_state(learner.critic.model, self.sharded)
        if optimizers:
            state["policy_optimizer"] = full_optimizer_state(learner.policy, learner.optimizer, self.sharded)
            if learner.critic is not None:
                state["critic_optimizer"] = full_optimizer_state(learner.critic.model, learner.critic.optimizer, self.sharded)
        return state if self.rank == 0 else None

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# --- the driver's side ---------------------------------------------------------------------------------


class LearnerRanks:
    """``world_size`` :class:`LearnerRank` actors in one placement group (a bundle of
    ``cpus_per_rank`` CPUs, and a GPU on CUDA, per rank), joined in one process group. Needs a
    connected Ray (``ray.init``); :meth:`close` removes the actors and the placement group."""

    def __init__(self, world_size: int, *, cuda: bool = False, cpus_per_rank: float = 1, timeout_s: float = 120.0):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size = world_size
        bundle = {"CPU": cpus_per_rank, **({"GPU": 1} if cuda else {})}
        self.group = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            raise LearnerRanksError(
                f"train.learner_workers: {world_size} ranks need {world_size} × {bundle} of the Ray cluster, which did not become "
                f"free within {timeout_s:.0f} s (cluster resources: {ray.cluster_resources()}); lower train.learner_workers or "
                "add nodes"
            ) from None
        actor = ray.remote(LearnerRank)
        self.actors = [
            actor.options(
                num_cpus=cpus_per_rank,
                num_gpus=1 if cuda else 0,
                name=None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
            ).remote(rank, world_size)
            for rank in range(world_size)
        ]
        address = ray.get(self.actors[0].address.remote())
        self.pids = self.call("join", address, "nccl" if cuda else "gloo", timeout_s)

    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank at once (collectives need them all); their results in rank order."""
        import ray

        return ray.get([getattr(actor, method).remote(*args) for actor in self.actors])

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        remove_placement_group(self.group)


class DataParallelLearner:
    """The driver's learner when ``train.learner_workers > 1``: what the loop, the pipeline and
    the checkpointer use of a :class:`PolicyLearner`, with the updates done by the ranks.

    ``mirror`` is the driver's own learner (never updated here): after each update it takes rank
    0's weights, counters and (before a checkpoint) optimizer states.
    """

    def __init__(self, mirror: PolicyLearner, ranks: LearnerRanks, recipe: RankRecipe, *, holds_ray: bool = False):
        # ``holds_ray``: this learner acquired the run's Ray (runtime/ray_cluster.py) and releases it on close.
        self.mirror, self.ranks, self.holds_ray = mirror, ranks, holds_ray
        try:
            ranks.call("build", recipe)
            self.push()  # every rank starts from the mirror's weights (e.g. the critic's random value head)
        except BaseException:
            ranks.close()
            raise

    # What the loop, setup and the checkpointer read of a learner: the mirror's.
    settings = property(lambda self: self.mirror.settings)
    policy = property(lambda self: self.mirror.policy)
    optimizer = property(lambda self: self.mirror.optimizer)
    critic = property(lambda self: self.mirror.critic)
    lora = property(lambda self: self.mirror.lora)
    optimizer_step = property(lambda self: self.mirror.optimizer_step)
    weight_version = property(lambda self: self.mirror.weight_version)  # the ranks', pulled after each update
    world_size = property(lambda self: self.ranks.world_size)

    def optimizer_steps_per_step(self) -> int:
        return self.mirror.optimizer_steps_per_step()

    def learning_rate(self, optimizer_step: int) -> float:
        return self.mirror.learning_rate(optimizer_step)

    def apply_optimizer_settings(self) -> None:
        self.mirror.apply_optimizer_settings()
        self.ranks.call("apply_optimizer_settings")

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, Tensor]]:
        return self.mirror.weights(dtype)

    def state_dict(self) -> dict[str, Any]:
        """The learner's bookkeeping, after the mirror took rank 0's optimizer states: the
        checkpointer calls this just before it writes the mirror's models and optimizers."""
        self.pull(optimizers=True)
        return self.mirror.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Counters into the mirror, then the mirror's whole state (a checkpoint just loaded into
        its models and optimizers, written by any number of ranks) to every rank."""
        self.mirror.load_state_dict(state)
        self.push()

    def update(self, batch: LearnerBatch, step_index: int = 0, weight_version: int | None = None) -> dict[str, float]:
        import ray

        results = self.ranks.call("update", ray.put(batch.to("cpu")), step_index, weight_version)
        if NONFINITE_KEY in results[0]:
            reason, consecutive, applied_steps = results[0][NONFINITE_KEY]
            if applied_steps:  # the ranks applied part of the update (the rest skipped): the mirror follows
                self.pull(optimizers=False)
            raise NonFiniteStop(reason, consecutive, applied_steps)
        self.pull(optimizers=False)
        return results[0]  # metrics are merged over the ranks inside the update

    def push(self) -> None:
        import ray

        m = self.mirror
        state: dict[str, Any] = {
            "policy": m.policy.state_dict(),
            "policy_optimizer": m.optimizer.state_dict(),
            "learner": m.state_dict(),
        }
        if m.critic is not None:
            state.update(critic=m.critic.model.state_dict(), critic_optimizer=m.critic.optimizer.state_dict())
        self.ranks.call("load", ray.put(state))

    def pull(self, *, optimizers: bool) -> None:
        state = self.ranks.call("full_state", optimizers)[0]
        m = self.mirror
        with torch.no_grad():
            m.policy.load_state_dict(state["policy"], strict=True)
            if m.critic is not None:
                m.critic.model.load_state_dict(state["critic"], strict=True)
        m.load_state_dict(state["learner"])
        if optimizers:
            m.optimizer.load_state_dict(state["policy_optimizer"])
            if m.critic is not None:
                m.critic.optimizer.load_state_dict(state["critic_optimizer"])

    def close(self) -> None:
        if self.ranks.actors:
            self.ranks.call("leave")
            self.ranks.close()
        if self.holds_ray:
            self.holds_ray = False
            release_ray()


def start_data_parallel_learner(mirror: PolicyLearner, recipe: RankRecipe, world_size: int) -> DataParallelLearner:
    """M ranks for ``mirror``'s learner, on the Ray the run is connected to, else a local one
    (:mod:`polyrl.runtime.ray_cluster`, shared with rollout workers; released on
    :meth:`DataParallelLearner.close`)."""
    if recipe.cuda and recipe.critic is not None:
        # FSDP2's forwards and backwards are collectives; the policy learner evens its micro-batch
        # counts over the ranks, the critic's loop (learner/critic.py) does not yet, so a rank with
        # fewer critic micro-batches would leave the others waiting until the group's time-out.
        raise LearnerRanksError(
            f"train.learner_workers: {world_size} on CUDA shards the critic (advantage.estimator: gae) with FSDP2, whose "
            "critic micro-batches are not yet evened across ranks; allowed: train.learner_workers: 1 with a critic on CUDA, "
            "an advantage estimator without a critic, or data-parallel ranks on the CPU"
        )
    acquire_ray()
    try:
        ranks = LearnerRanks(world_size, cuda=recipe.cuda, cpus_per_rank=recipe.threads)
        return DataParallelLearner(mirror, ranks, recipe, holds_ray=True)
    except BaseException:
        release_ray()
        raise
