"""``objective:``, ``advantage:`` and ``modalities:``: the learner's loss, the advantage estimator
with DAPO's data-side options, and the per-modality GAE discounts. Names are checked against
the registries of :mod:`polyrl.algos` (imported inside the validators, where the registries are
read); typed params are checked where the objective and the estimator meet
(:class:`polyrl.config.experiment.ExperimentConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from polyrl.config.base import StrictModel


class ObjectiveConfig(StrictModel):
    name: str = "grpo"
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The objective's typed params (`polyrl objectives show NAME`); kl_coef, kl_estimator and entropy_coef live in train.",
    )
    aggregation: str | None = Field(None, description="Loss aggregation mode; default: the objective's own.")

    @field_validator("name")
    @classmethod
    def _registered_objective(cls, name: str) -> str:
        from polyrl.algos.objectives import list_objectives

        allowed = [spec.name for spec in list_objectives()]
        if name not in allowed:
            raise ValueError(f"unknown objective {name!r}; allowed: {', '.join(allowed)}")
        return name

    @field_validator("aggregation")
    @classmethod
    def _known_aggregation(cls, mode: str | None) -> str | None:
        from polyrl.algos.aggregation import AGGREGATION_MODES

        if mode is not None and mode not in AGGREGATION_MODES:
            raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGGREGATION_MODES)}")
        return mode


class DynamicSamplingConfig(StrictModel):
    """DAPO's dynamic sampling: drop groups whose rewards all agree, refill, bounded."""

    enabled: bool = False
    max_rounds: int = Field(3, ge=1)


class OverlongConfig(StrictModel):
    """DAPO's overlong handling: soft punishment added to the reward, or masking truncated samples."""

    mode: Literal["off", "soft_punishment", "mask_truncated"] = "off"
    max_length: int | None = Field(None, ge=1, description="L_max; default rollout.max_tokens")
    cache_length: int = Field(16, ge=0)
    penalty_weight: float = 1.0


class AdvantageConfig(StrictModel):
    estimator: str | None = Field(None, description="Advantage estimator; default: the objective's own.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="The estimator's typed params (`polyrl objectives show NAME --advantage`)."
    )
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    overlong: OverlongConfig = OverlongConfig()

    @field_validator("estimator")
    @classmethod
    def _registered_estimator(cls, name: str | None) -> str | None:
        from polyrl.algos.advantages import list_advantages

        allowed = [spec.name for spec in list_advantages()]
        if name is not None and name not in allowed:
            raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(allowed)}")
        return name


class ModalityGAEConfig(StrictModel):
    gamma: float = Field(..., gt=0, le=1)
    lam: float = Field(..., ge=0, le=1)


class ModalitiesConfig(StrictModel):
    """Per-modality GAE settings (seed 003 §7): each token uses its own modality's γ/λ."""

    text: ModalityGAEConfig = ModalityGAEConfig(gamma=0.95, lam=0.9)
    image: ModalityGAEConfig = ModalityGAEConfig(gamma=0.85, lam=0.8)
