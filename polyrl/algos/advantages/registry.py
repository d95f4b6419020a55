"""The advantage estimators' registry and their one input type."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from torch import Tensor

from polyrl.algos.params import Params, param_defaults, validate_params


@dataclass(frozen=True)
class AdvantageInputs:
    """Every tensor an estimator may use; ``None`` where the learner has none.

    ``rewards`` is [B] (sequence) or [B, T] (token rewards); the others are [B, T] except
    ``group_ids`` [B] (equal for the G samples of one prompt) and ``baselines`` [B].
    """

    rewards: Tensor
    mask: Tensor  # 1 on response tokens
    group_ids: Tensor | None = None
    values: Tensor | None = None  # value-head predictions
    gammas: Tensor | None = None  # per-token discount: each token's modality setting
    lambdas: Tensor | None = None  # per-token GAE lambda
    baselines: Tensor | None = None  # [B] a reward baseline per sample (ReMax: its prompt's greedy completion's reward)

    def require(self, name: str) -> Tensor:
        """The tensor ``name``; a ``ValueError`` naming it when the learner passed none."""
        tensor: Tensor | None = getattr(self, name)
        if tensor is None:
            raise ValueError(f"this advantage estimator needs the {name!r} tensor")
        return tensor


INPUT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(AdvantageInputs))

# fn(inputs, **params) -> (advantages [B, T] or value targets [B, T], metrics)
AdvantageFn = Callable[..., tuple[Tensor, dict[str, float]]]


@dataclass(frozen=True)
class AdvantageSpec:
    name: str
    fn: AdvantageFn
    description: str
    paper: str
    requires: tuple[str, ...] = ()
    value_targets: AdvantageFn | None = None
    params: type[Params] = Params
    default_params: dict[str, Any] = field(default_factory=dict)

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """User ``params`` as proper Python values; a pydantic ``ValidationError`` otherwise."""
        return validate_params(self.params, params, owner=f"advantage estimator {self.name!r}")


_ADVANTAGES: dict[str, AdvantageSpec] = {}


def register_advantage(
    name: str,
    *,
    description: str,
    paper: str,
    requires: tuple[str, ...] = (),
    value_targets: AdvantageFn | None = None,
    params: type[Params] = Params,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator ``fn(inputs, **params)`` with its typed ``params`` model (the defaults live there)."""
    unknown = set(requires) - set(INPUT_NAMES)
    if unknown:
        raise ValueError(f"requires names unknown tensors {sorted(unknown)}; known: {INPUT_NAMES}")

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in _ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        accepted = set(list(inspect.signature(fn).parameters)[1:])
        if set(params.model_fields) - accepted:
            raise ValueError(f"advantage estimator {name!r}: fn must accept {sorted(set(params.model_fields) - accepted)}")
        _ADVANTAGES[name] = AdvantageSpec(
            name=name,
            fn=fn,
            description=description,
            paper=paper,
            requires=("rewards", "mask", *requires),
            value_targets=value_targets,
            params=params,
            default_params=param_defaults(params),
        )
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageSpec:
    if name not in _ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; registered estimators: {', '.join(_ADVANTAGES)}")
    return _ADVANTAGES[name]


def list_advantages() -> list[AdvantageSpec]:
    return list(_ADVANTAGES.values())
