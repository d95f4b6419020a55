"""A model of one run's schedule on many devices: from the phase times of one step measured on
one device to a predicted step time, samples/s, speed-up, buffer utilisation and communication
share for rollout workers, learner ranks and staleness: a speed-up measured on one device and
modelled from there, never claimed without a measurement (docs/scaling.md).

What it assumes (each a simplification, stated so a prediction can be judged):

* **Generation** splits over ``workers`` by whole prompts (the collector hands each worker a
  contiguous share of the step's prompts): the busiest worker takes ``ceil(P/W)/P`` of the
  measured time. Engines are independent; a worker's ``gpus_per_worker`` count devices only
  (a tensor-parallel engine's own speed-up is in its measured time, not modelled).
* **Scoring** and the driver's **logging** stay serial on the driver (Amdahl's term).
* **Log-probs/advantages** and the **update** split over ``learner_ranks`` by samples
  (``ceil(B/R)/B``), plus, for R > 1, a ring all-reduce of the gradients per optimizer step:
  ``2 (R-1)/R · gradient_bytes / bandwidth`` (the bandwidth term of Patarasuk & Yuan 2009;
  latency ignored).
* **Weights** after an update: colocated engines (each device holds an engine and a learner
  rank, verl's hybrid engine; plain data parallelism leaves full weights on every rank) load them
  locally; separate engines (OpenRLHF's layout) get them by one pipelined broadcast,
  ``weight_bytes / bandwidth``, whatever the number of workers. Every engine then loads them
  (the measured ``sync`` time, in parallel on all workers).
* **Synchronous** (staleness 0): the phases run one after another, so the step is their sum.
  **Asynchronous** (staleness k >= 1, separate devices only): the engines generate batch i+1..i+k
  while the learner trains batch i; the steps are simulated one by one with the bound "no batch
  generated with weights more than k versions older than the learner's", and the steady state is
  read off the second half. With constant phase times the step is max(generation side, learner
  side) for every k >= 1; a larger k only absorbs jitter, which the model does not have.
* **Buffer utilisation** is defined as the asynchronous loop logs it (``async/buffer_utilisation``):
  batches ready when the learner asks for one, over the ``k`` batches generation may run ahead,
  at most 1. polyrl's own health heuristic asks for >= 70 % (``health.min_buffer_utilisation``).
  Undefined (None) in synchronous mode.
* **Communication share**: (all-reduce + broadcast) seconds over the step's seconds; polyrl's
  own health heuristic asks for <= 15 % (``health.max_sync_share``).

No device is simulated below the phase level; memory limits (whether a model fits a device) are
the user's to check. Pure Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SIMULATED_STEPS = 200  # enough for the pipeline's start-up to vanish from the second half


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of one training step of the whole batch on one device, in-process (polyrl's
    ``perf/<phase>_s``); ``logprobs`` is ``perf/advantage_s`` (old/reference log-probs and advantages)."""

    generate: float
    score: float
    logprobs: float
    update: float
    sync: float
    prompts: int
    samples: int
    log: float = 0.0

    def __post_init__(self) -> None:
        for name in ("generate", "score", "logprobs", "update", "sync", "log"):
            if getattr(self, name) < 0:
                raise ValueError(f"phase time {name} must be >= 0, got {getattr(self, name)}")
        if self.prompts < 1 or self.samples < self.prompts:
            raise ValueError(f"need prompts >= 1 and samples >= prompts, got prompts={self.prompts} samples={self.samples}")

    @property
    def one_device_step_s(self) -> float:
        return self.generate + self.score + self.logprobs + self.update + self.sync + self.log


@dataclass(frozen=True)
class Cluster:
    """Where the run's parts go and what connects them."""

    workers: int = 1
    learner_ranks: int = 1
    staleness: int = 0
    colocated: bool = True  # engines share the learner ranks' devices (needs workers == learner_ranks)
    gpus_per_worker: int = 1
    gpus_per_rank: int = 1
    weight_bytes: float = 0.0  # what the learner sends the engines after an update
    gradient_bytes: float | None = None  # what the ranks all-reduce per optimizer step; default weight_bytes
    bandwidth_gb_s: float = 25.0  # between devices, GB/s (PCIe 4 x16 ~25, NVLink 3 ~250 for all-reduce, 100 Gb/s IB ~12)
    optimizer_steps: int = 1  # all-reduces per training step (epochs × mini-batches)

    def __post_init__(self) -> None:
        if self.workers < 1 or self.learner_ranks < 1 or self.staleness < 0 or self.optimizer_steps < 1:
            raise ValueError("workers, learner_ranks and optimizer_steps must be >= 1 and staleness >= 0")
        if self.gpus_per_worker < 1 or self.gpus_per_rank < 1 or self.bandwidth_gb_s <= 0 or self.weight_bytes < 0:
            raise ValueError("gpus_per_worker and gpus_per_rank must be >= 1, bandwidth_gb_s > 0 and weight_bytes >= 0")
        if self.colocated and self.workers != self.learner_ranks:
            raise ValueError(
                f"colocated engines need one per learner rank: workers {self.workers} != learner_ranks "
                f"{self.learner_ranks} (or colocated=False: engines on devices of their own)"
            )
        if self.colocated and self.staleness > 0:
            raise ValueError(
                "asynchronous training (staleness >= 1) overlaps generation with the update, which needs "
                "engines on devices of their own (colocated=False)"
            )

    @property
    def devices(self) -> int:
        ranks = self.learner_ranks * self.gpus_per_rank
        return max(ranks, self.workers * self.gpus_per_worker) if self.colocated else ranks + self.workers * self.gpus_per_worker


@dataclass(frozen=True)
class Prediction:
    cluster: Cluster
    step_s: float
    samples_per_s: float
    speedup: float  # over one device running every phase in turn
    generation_side_s: float  # per step: generate + score + load weights
    learner_side_s: float  # per step: log-probs + update + all-reduce + broadcast + log
    communication_s: float  # all-reduce + broadcast per step
    learner_wait_s: float  # per step, waiting for a batch
    engine_wait_s: float  # per step, waiting for newer weights (the staleness bound)
    buffer_utilisation: float | None  # asynchronous only
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def communication_share(self) -> float:
        return self.communication_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def devices(self) -> int:
        return self.cluster.devices


def busiest_share(items: int, parts: int) -> float:
    """The fraction of ``items`` the busiest of ``parts`` gets when split in whole items."""
    return math.ceil(items / parts) / items


def allreduce_s(nbytes: float, ranks: int, bandwidth_gb_s: float) -> float:
    """Ring all-reduce, bandwidth term: each rank sends and receives 2 (R-1)/R of the buffer."""
    return 0.0 if ranks <= 1 else 2 * (ranks - 1) / ranks * nbytes / (bandwidth_gb_s * 1e9)


def phase_seconds(times: PhaseTimes, cluster: Cluster) -> dict[str, float]:
    """Each phase's seconds per step on ``cluster`` (before any overlap)."""
    gradient_bytes = cluster.weight_bytes if cluster.gradient_bytes is None else cluster.gradient_bytes
    ranks_share = busiest_share(times.samples, cluster.learner_ranks)
    return {
        "generate": times.generate * busiest_share(times.prompts, cluster.workers),
        "score": times.score,
        "load_weights": times.sync,
        "logprobs": times.logprobs * ranks_share,
        "update": times.update * ranks_share,
        "allreduce": cluster.optimizer_steps * allreduce_s(gradient_bytes, cluster.learner_ranks, cluster.bandwidth_gb_s),
        "broadcast": 0.0 if cluster.colocated else cluster.weight_bytes / (cluster.bandwidth_gb_s * 1e9),
        "log": times.log,
    }


def simulate_pipeline(generation_s: float, learner_s: float, staleness: int, steps: int = SIMULATED_STEPS) -> dict[str, float]:
    """Step by step: the engines generate batch i once the learner has made version i-1-k
    (k = staleness; version 0 exists at the start) and they are free; the learner trains batch i
    once it is generated and step i-1 is done, making version i. Returns the steady state's step
    time, waits and buffer utilisation (means over the second half of ``steps``)."""
    version_at = [0.0]  # version_at[v]: when version v exists
    generated = [0.0]  # generated[i]: when batch i is ready (index 0 unused)
    engine_wait, learner_wait = [], []
    engine_free = 0.0
    for i in range(1, steps + 1):
        weights = version_at[max(0, i - 1 - staleness)]  # made by an earlier learner step
        engine_wait.append(max(0.0, weights - engine_free))
        engine_free = max(engine_free, weights) + generation_s
        generated.append(engine_free)
        learner_wait.append(max(0.0, generated[i] - version_at[i - 1]))  # the learner asks when step i-1 is done
        version_at.append(max(version_at[i - 1], generated[i]) + learner_s)
    half = steps // 2
    utilisation = []  # the last k steps are left out: the batches after them are never generated
    for i in range(half + 1, steps + 1 - staleness if staleness else half + 1):
        ready = sum(1 for j in range(i, i + staleness + 1) if generated[j] <= version_at[i - 1])
        utilisation.append(min(ready, staleness) / staleness)
    return {
        "step_s": (version_at[steps] - version_at[half]) / (steps - half),
        "learner_wait_s": _mean(learner_wait[half:]),
        "engine_wait_s": _mean(engine_wait[half:]),
        "buffer_utilisation": _mean(utilisation) if staleness else math.nan,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def predict(times: PhaseTimes, cluster: Cluster) -> Prediction:
    phases = phase_seconds(times, cluster)
    generation_side = phases["generate"] + phases["score"] + phases["load_weights"]
    learner_side = phases["logprobs"] + phases["update"] + phases["allreduce"] + phases["broadcast"] + phases["log"]
    communication = phases["allreduce"] + phases["broadcast"]
    if cluster.staleness == 0:  # one after another: the learner waits for the whole generation and vice versa
        step, learner_wait, engine_wait, utilisation = generation_side + learner_side, generation_side, learner_side, None
    else:
        run = simulate_pipeline(generation_side, learner_side, cluster.staleness)
        step, learner_wait, engine_wait = run["step_s"], run["learner_wait_s"], run["engine_wait_s"]
        utilisation = run["buffer_utilisation"]
    return Prediction(
        cluster=cluster,
        step_s=step,
        samples_per_s=times.samples / step,
        speedup=times.one_device_step_s / step,
        generation_side_s=generation_side,
        learner_side_s=learner_side,
        communication_s=communication,
        learner_wait_s=learner_wait,
        engine_wait_s=engine_wait,
        buffer_utilisation=utilisation,
        phases=phases,
    )


def layouts_for(devices: int, **links) -> list[Cluster]:
    """The layouts compared on ``devices`` devices: synchronous with an engine and a learner rank
    on every device, and (from 2 devices) asynchronous with k = 1 and every split of the devices
    into engines and ranks (one device each at least)."""
    out = [Cluster(workers=devices, learner_ranks=devices, staleness=0, colocated=True, **links)]
    out += [Cluster(workers=w, learner_ranks=devices - w, staleness=1, colocated=False, **links) for w in range(1, devices)]
    return out


def best_layouts(times: PhaseTimes, devices: int, **links) -> dict[str, Prediction]:
    """The synchronous colocated prediction and the fastest asynchronous split on ``devices`` devices."""
    predictions = [predict(times, cluster) for cluster in layouts_for(devices, **links)]
    best = {"sync": predictions[0]}
    if len(predictions) > 1:
        best["async"] = min(predictions[1:], key=lambda p: p.step_s)
    return best
