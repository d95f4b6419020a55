"""The objective registry: one :class:`ObjectiveSpec` per name, with typed parameters."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import Tensor

from polyrl.algos.aggregation import check_aggregation_mode
from polyrl.algos.params import Params, number, param_defaults, validate_params

ObjectiveFn = Callable[..., tuple[Tensor, dict[str, float]]]
PrepareFn = Callable[..., dict[str, Any]]
PresetClip = Callable[[float], dict[str, float]]

# Settings whose one home is ``train.*``: the trainer passes them to every objective call (the
# functions keep the keywords), so they are refused as ``objective.params``.
TRAIN_SETTINGS: dict[str, str] = {
    "kl_coef": "train.kl_coef",
    "kl_estimator": "train.kl_estimator",
    "entropy_coef": "train.entropy_coef",
}


class ObjectiveParams(Params):
    """Parameters every objective accepts besides its own."""

    high_prob_threshold: float = number(
        0.5, gt=0, le=1, description="p at or above which a token counts as high-probability in the quadrant metrics"
    )


# Kept for callers that read the shared defaults.
SHARED_PARAMS: dict[str, Any] = param_defaults(ObjectiveParams)

_COMMON_ARGUMENTS = {"logprobs", "old_logprobs", "advantages", "mask", "loss_normalizer", "aggregation", "entropy"}


@dataclass(frozen=True)
class ObjectiveSpec:
    """A registered objective.

    ``params`` is the typed parameter model; ``default_params`` its defaults as a dict (what the
    trainer merges user params over). ``prepare``, when set, is called once per mini-batch before
    the micro-batch loop, without gradient, as
    ``prepare(logprobs, old_logprobs, advantages, mask, *, entropy, **params) -> dict`` on the
    whole mini-batch; its dict (batch-level scalars only) is passed as extra keywords to every
    micro-batch call of ``fn``, which makes batch-level choices independent of the split.
    ``preset_clip`` maps a preset's clip width epsilon onto this objective's params, or is None
    when presets must leave the objective's own clip scale alone.
    """

    name: str
    fn: ObjectiveFn
    description: str
    paper: str
    default_aggregation: str
    default_advantage: str
    params: type[ObjectiveParams] = ObjectiveParams
    default_params: dict[str, Any] = field(default_factory=dict)
    deviations: str = ""
    prepare: PrepareFn | None = None
    preset_clip: PresetClip | None = None

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """User ``params`` as proper Python values; a pydantic ``ValidationError`` otherwise."""
        return validate_params(self.params, params, owner=f"objective {self.name!r}", moved=TRAIN_SETTINGS)


_OBJECTIVES: dict[str, ObjectiveSpec] = {}


def _accepted_keywords(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    parameters = inspect.signature(fn).parameters.values()
    names = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY} - _COMMON_ARGUMENTS
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def register_objective(
    name: str,
    *,
    description: str,
    paper: str,
    default_aggregation: str,
    default_advantage: str,
    params: type[ObjectiveParams] = ObjectiveParams,
    deviations: str = "",
    prepare: PrepareFn | None = None,
    preset_clip: PresetClip | None = None,
) -> Callable[[ObjectiveFn], ObjectiveFn]:
    """Register ``fn`` under ``name`` with its typed ``params`` model (the defaults live there).
    One function can serve several named objectives that differ only in their params model
    (PPO, GRPO, Dr.GRPO and DAPO share the PPO-clip surrogate)."""
    check_aggregation_mode(default_aggregation)

    def decorator(fn: ObjectiveFn) -> ObjectiveFn:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        keywords, takes_shared = _accepted_keywords(fn)
        own = set(params.model_fields) - set(ObjectiveParams.model_fields)
        if own - keywords or not takes_shared:
            raise ValueError(f"objective {name!r}: fn must accept {sorted(own - keywords)} and **shared")
        _OBJECTIVES[name] = ObjectiveSpec(
            name=name, fn=fn, description=description, paper=paper,
            default_aggregation=default_aggregation, default_advantage=default_advantage,
            params=params, default_params=param_defaults(params), deviations=deviations,
            prepare=prepare, preset_clip=preset_clip,
        )  # fmt: skip
        return fn

    return decorator


def get_objective(name: str) -> ObjectiveSpec:
    if name not in _OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; registered objectives: {', '.join(_OBJECTIVES)}")
    return _OBJECTIVES[name]


def list_objectives() -> list[ObjectiveSpec]:
    return list(_OBJECTIVES.values())
