"""A reward module that scores in a Ray actor of its own (``remote: true`` on its reward entry).

For heavy modules, e.g. ``ppl_fluency`` and its scoring language model: the model lives in the
actor's process (with its own CPUs, or a GPU), not in the training driver's. The actor builds the
module from the same spec (registered name, ``package.module:Class`` or a file path resolved
against the same folder) and runs the same ``setup`` and ``score``, so the scores are the local
ones. The driver still builds the module once, without setting it up, so a bad parameter is
reported when the experiment is loaded, as for a local module.

Ray: the cluster the run is connected to, else a local one (:mod:`polyrl.runtime.ray_cluster`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl.rewards.base import RewardBatch
from polyrl.rewards.registry import build_reward, load_reward_class
from polyrl.runtime.ray_cluster import acquire_ray, release_ray


class RewardActor:
    """The body of the reward's Ray actor: one module, built from its spec."""

    def __init__(self, spec: dict[str, Any], base_dir: str | None, label: str, threads: int):
        import torch

        torch.set_num_threads(threads)
        cls = load_reward_class(spec["module"], base_dir=base_dir)
        self.module = build_reward(cls, spec["params"], ref=spec["module"], label=label)  # as RewardSpec.build does

    def setup(self) -> None:
        setup = getattr(self.module, "setup", None)
        if setup is not None:
            setup()

    def score(self, batch: RewardBatch) -> Any:
        return self.module.score(batch)


class RemoteRewardModule:
    """Stands in for a reward module in :class:`~polyrl.rewards.CompositeReward`: ``setup`` starts
    the actor (and the module's own setup there), ``score`` asks it, ``close`` stops it."""

    def __init__(self, spec: Any, *, base_dir: str | Path | None, label: str):
        self.spec = spec.model_dump()
        self.base_dir = None if base_dir is None else str(base_dir)
        self.label = label
        self.num_cpus, self.num_gpus = spec.remote_resources.num_cpus, spec.remote_resources.num_gpus
        self.actor: Any = None
        self._ray: Any = None

    def setup(self) -> None:
        if self.actor is not None:
            return
        ray = self._ray = acquire_ray()
        actor = ray.remote(RewardActor).options(num_cpus=self.num_cpus, num_gpus=self.num_gpus)
        self.actor = actor.remote(self.spec, self.base_dir, self.label, max(1, int(self.num_cpus)))
        ray.get(self.actor.setup.remote())  # the module's own setup errors surface here

    def score(self, batch: RewardBatch) -> Any:
        self.setup()
        return self._ray.get(self.actor.score.remote(batch))

    def close(self) -> None:
        if self.actor is None:
            return
        self._ray.kill(self.actor)
        self.actor = None
        release_ray()

    def __repr__(self) -> str:
        return f"RemoteRewardModule({self.label!r}, {self.spec['module']!r})"
