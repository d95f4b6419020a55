"""A weighted sum of reward modules, as configured by a list of :class:`RewardSpec`.

Choice on missing scores: a sample's total is ``None`` when any module returned ``None`` for
it. Dropping the missing term instead would put that sample on a different scale from the
rest of its group, and counting it as 0 would invent a score; the trainer decides what to do
with an unscored sample (e.g. leave it out of the advantage). Means and standard deviations
are over scored samples only, and ``unscored`` counts the ``None`` values.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polyrl.core.user_code import TimeBudgetError, call_with_time_budget
from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModuleError, module_label
from polyrl.rewards.registry import build_reward, load_reward_class
from polyrl.rewards.summary import SCORE_LIMIT, mean_and_std

# A module's time budget per batch when its spec sets none (rewards[].timeout_s).
DEFAULT_TIMEOUT_S = 300.0


class RemoteScoring(BaseModel):
    """The Ray resources of a reward module that scores in an actor of its own."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs of the actor (its torch threads: max(1, int(num_cpus)))")
    num_gpus: float = Field(0.0, ge=0, description="GPUs of the actor (a fraction shares one)")


class RewardSpec(BaseModel):
    """One reward term of an experiment: which module, its weight, its parameters."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    module: str = Field(description="registered name, 'package.module:Class' or 'path/to/file.py:Class'")
    weight: float = Field(1.0, description="multiplier of this term in the total reward")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the module's constructor")
    name: str | None = Field(None, description="label in metrics; defaults to the module's registered name")
    on_nonfinite: Literal["error", "none"] = Field(
        "error", description="NaN/inf from the module: raise ('error') or treat as unscored ('none')"
    )
    allow_unscored: bool = Field(
        False, description="accept a batch where the module scores no sample (all None); by default that is an error"
    )
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        description="seconds one score() call on a batch may take (setup excluded); past it the run stops with an "
        "error naming the module (the stuck call cannot be interrupted, so the run cannot go on)",
    )
    remote: bool | RemoteScoring = Field(
        False,
        description="score in a Ray actor instead of this process (true: 1 CPU; or {num_cpus, num_gpus}): for heavy "
        "modules such as ppl_fluency; the same module and scores (polyrl/rewards/remote.py)",
    )

    @property
    def remote_resources(self) -> RemoteScoring | None:
        """The actor's resources when the module scores remotely, else None."""
        if self.remote is False:
            return None
        return RemoteScoring() if self.remote is True else self.remote

    @field_validator("module")
    @classmethod
    def _module_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("module reference must not be empty")
        return value.strip()

    @field_validator("weight")
    @classmethod
    def _weight_finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"weight must be finite, got {value}")
        return value

    def resolve(self, *, base_dir: str | Path | None = None) -> type:
        """The module class this spec names."""
        return load_reward_class(self.module, base_dir=base_dir)

    def build(self, *, base_dir: str | Path | None = None) -> Any:
        """An instance of the module with ``params`` (not yet set up)."""
        cls = self.resolve(base_dir=base_dir)
        return build_reward(cls, self.params, ref=self.module, label=self.name or module_label(cls))


@dataclass
class RewardResult:
    """Scores of one batch: weighted totals and each module's raw (unweighted) scores."""

    totals: list[float | None]
    per_module: dict[str, list[float | None]]
    weights: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """``reward/<label>/{mean,std,unscored}`` per module and ``reward/{mean,std,unscored}``.

        Mean and (population, ddof=0) std are over scored samples only; they are left out
        when no sample was scored, and ``unscored`` counts the ``None`` values.
        """
        out: dict[str, float] = {}
        for label, values in self.per_module.items():
            out.update(_summary(values, f"reward/{label}/"))
        out.update(_summary(self.totals, "reward/"))
        return out


def _summary(values: Sequence[float | None], prefix: str) -> dict[str, float]:
    scored = [v for v in values if v is not None]
    out = {f"{prefix}unscored": float(len(values) - len(scored))}
    if scored:
        out[f"{prefix}mean"], out[f"{prefix}std"] = mean_and_std(scored)
    return out


def run_module(
    module: Any, batch: RewardBatch, *, label: str, on_nonfinite: str = "error", timeout_s: float | None = None
) -> list[float | None]:
    """Score ``batch`` with ``module`` and enforce the contract, naming the culprit on failure.

    When the batched call raises, the module is re-run one sample at a time to find the first
    sample that fails on its own. Each call has ``timeout_s`` seconds (None: no limit); past it,
    :class:`RewardModuleError` names the module (see :func:`polyrl.core.user_code.call_with_time_budget`).
    """
    try:
        values = timed_score(module, batch, label=label, timeout_s=timeout_s)
    except RewardStopped:
        raise
    except Exception as error:  # noqa: BLE001 - any module failure is reported the same way
        index, sample_error = locate_failing_sample(module, batch, label=label, timeout_s=timeout_s)
        if index is None:
            raise RewardModuleError(
                f"reward module {label!r} raised {type(error).__name__}: {error} on a batch of {len(batch)} "
                "samples, but no single sample fails on its own",
                label=label,
            ) from error
        raise RewardModuleError(
            f"reward module {label!r} raised {type(sample_error).__name__}: {sample_error} on {batch.sample(index)}",
            label=label,
            index=index,
        ) from error
    return validate_scores(values, batch, label=label, on_nonfinite=on_nonfinite)


class RewardStopped(RewardModuleError):
    """A module's score ran past its time budget or tried to end the process: not retried per sample."""


def timed_score(module: Any, batch: RewardBatch, *, label: str, timeout_s: float | None) -> Any:
    """``module.score(batch)`` within ``timeout_s`` seconds, else :class:`RewardModuleError` naming the module."""
    try:
        return call_with_time_budget(module.score, batch, timeout_s=timeout_s, what=f"reward module {label!r}")
    except SystemExit as error:  # would end the run with its exit status (0 for sys.exit()) and no message
        raise RewardStopped(f"reward module {label!r} called sys.exit({error.code!r}) in score", label=label) from None
    except TimeBudgetError as error:
        raise RewardStopped(
            f"{error}; it was scoring a batch of {len(batch)} samples (first: {batch.sample(0) if len(batch) else '-'}). "
            "If it is slow rather than stuck, raise its rewards[].timeout_s (polyrl rewards check: --timeout)",
            label=label,
        ) from None


def locate_failing_sample(
    module: Any, batch: RewardBatch, *, label: str = "", timeout_s: float | None = None
) -> tuple[int | None, BaseException | None]:
    """The first index whose one-sample batch makes ``module.score`` raise, and the error."""
    for i in range(len(batch)):
        try:
            timed_score(module, batch.subset([i]), label=label or type(module).__name__, timeout_s=timeout_s)
        except RewardStopped:
            raise
        except Exception as error:  # noqa: BLE001
            return i, error
    return None, None


def validate_scores(values: Any, batch: RewardBatch, *, label: str, on_nonfinite: str = "error") -> list[float | None]:
    """Check a module's return value: a list of len(batch) numbers or None; NaN/inf policy."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise RewardModuleError(
            f"reward module {label!r} returned {type(values).__name__}; expected a list of {len(batch)} floats or None",
            label=label,
        )
    values = list(values)
    if len(values) != len(batch):
        raise RewardModuleError(
            f"reward module {label!r} returned {len(values)} scores for a batch of {len(batch)} samples", label=label
        )
    out: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardModuleError(
                f"reward module {label!r} returned {value!r} ({type(value).__name__}) for {batch.sample(i)}; "
                "expected a float or None",
                label=label,
                index=i,
            )
        value = float(value)
        if not math.isfinite(value):
            if on_nonfinite == "none":
                out.append(None)
                continue
            raise RewardModuleError(
                f"reward module {label!r} returned {value} for {batch.sample(i)} "
                "(set on_nonfinite: none to treat non-finite scores as unscored)",
                label=label,
                index=i,
            )
        if abs(value) > SCORE_LIMIT:
            # Finite, but the learner holds rewards as float32 (max ~3.4e38), where it would
            # become inf, and the batch's mean and std may not be floats at all.
            raise RewardModuleError(
                f"reward module {label!r} returned {value:g} for {batch.sample(i)}: beyond the float32 range "
                f"(|score| <= {SCORE_LIMIT:.4g}) rewards are trained in, so its mean over the batch is not representable; "
                "rescale the score",
                label=label,
                index=i,
            )
        out.append(value)
    return out


class CompositeReward:
    """The weighted sum of several reward modules.

    ``CompositeReward(specs).score(batch)`` returns a :class:`RewardResult`; ``setup`` is called
    on first use if the caller has not called it.
    """

    def __init__(self, specs: Sequence[RewardSpec | dict[str, Any]], *, base_dir: str | Path | None = None):
        if not specs:
            raise RewardConfigError("a composite reward needs at least one reward spec")
        self.specs = [s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs]
        self.modules: dict[str, Any] = {}
        self.weights: dict[str, float] = {}
        self._policies: dict[str, str] = {}
        self._allow_unscored: dict[str, bool] = {}
        self._timeouts: dict[str, float] = {}
        for spec in self.specs:
            cls = spec.resolve(base_dir=base_dir)
            label = spec.name or module_label(cls)
            if label in self.modules:
                raise RewardConfigError(
                    f"two rewards are labelled {label!r}; give one of them a distinct 'name' in the reward spec"
                )
            module = spec.build(base_dir=base_dir)  # remote too: bad params are named here, not in the actor
            if spec.remote_resources is not None:
                from polyrl.rewards.remote import RemoteRewardModule

                module = RemoteRewardModule(spec, base_dir=base_dir, label=label)
            self.modules[label] = module
            self.weights[label] = spec.weight
            self._policies[label] = spec.on_nonfinite
            self._allow_unscored[label] = spec.allow_unscored
            self._timeouts[label] = spec.timeout_s
        self._set_up = False

    @property
    def labels(self) -> list[str]:
        return list(self.modules)

    def setup(self) -> None:
        if self._set_up:
            return
        for label, module in self.modules.items():
            setup = getattr(module, "setup", None)
            if setup is None:
                continue
            try:
                setup()
            except RewardConfigError:
                raise
            except Exception as error:  # noqa: BLE001
                raise RewardModuleError(
                    f"reward module {label!r} failed in setup: {type(error).__name__}: {error}", label=label
                ) from error
        self._set_up = True

    def close(self) -> None:
        """Release what modules hold outside this process (a remote module's actor)."""
        for module in self.modules.values():
            close = getattr(module, "close", None)
            if close is not None:
                close()

    def score(self, batch: RewardBatch) -> RewardResult:
        self.setup()
        per_module = {
            label: run_module(module, batch, label=label, on_nonfinite=self._policies[label], timeout_s=self._timeouts[label])
            for label, module in self.modules.items()
        }
        for label, scores in per_module.items():
            # A module that scores nothing would make every total None: training would go on
            # with no signal and an empty reward/mean. Refuse unless the YAML says it is expected.
            if len(batch) and all(value is None for value in scores) and not self._allow_unscored[label]:
                # A module that knows why (a judge's budget, its unreadable answers) says so; else the data is the usual cause.
                reason = getattr(self.modules[label], "unscored_reason", lambda: None)()
                cause = reason or "check that the data has what it needs (e.g. references or an answer field)"
                raise RewardModuleError(
                    f"reward module {label!r} returned None for all {len(batch)} samples of the batch "
                    f"(first: {batch.sample(0)}); {cause}; or set allow_unscored: true in its reward spec if this is expected",
                    label=label,
                )
        totals: list[float | None] = []
        for i in range(len(batch)):
            terms = [(self.weights[label], scores[i]) for label, scores in per_module.items()]
            if any(value is None for _, value in terms):
                totals.append(None)
                continue
            try:
                total = math.fsum(weight * value for weight, value in terms)
            except (OverflowError, ValueError):  # an intermediate sum past the float range, or inf - inf
                total = math.inf
            if not abs(total) <= SCORE_LIMIT:
                parts = ", ".join(f"{label} {self.weights[label]:g} × {scores[i]:g}" for label, scores in per_module.items())
                raise RewardModuleError(
                    f"the total reward of {batch.sample(i)} is {total:g} ({parts}): beyond the float32 range "
                    f"(|total| <= {SCORE_LIMIT:.4g}) rewards are trained in; rescale the weights or the scores"
                )
            totals.append(total)
        return RewardResult(totals=totals, per_module=per_module, weights=dict(self.weights))
