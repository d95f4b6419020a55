"""``objective:``, ``advantage:`` and ``modalities:``: the learner's loss, the advantage estimator
with DAPO's data-side options, and the per-modality GAE discounts. Names are checked against
the registries of :mod:`polyrl.algos` (imported inside the validators, where the registries are
read); typed params are checked where the objective and the estimator meet
(:class:`polyrl.config.experiment.ExperimentConfig`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from polyrl.config.base import StrictModel


class RatioBandConfig(StrictModel):
    """A band ``[low, high]`` around 1 for the ratio ρ = π_target / π_sampler; what leaves it is
    masked. verl's code bounds the inverse (docs/rollout_correction.md, "Which ratio a band bounds")."""

    low: float = Field(..., gt=0, le=1, description="Lower bound of ρ = π_target / π_sampler (≤ 1).")
    high: float = Field(..., ge=1, description="Upper bound of the ratio (≥ 1).")

    @model_validator(mode="after")
    def _not_empty(self) -> "RatioBandConfig":
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        return self


class RolloutCorrectionConfig(StrictModel):
    """Rollout correction (docs/rollout_correction.md; verl's ``algorithm.rollout_correction``):
    importance weights and rejection masks for a sampler that differs from the learner (bf16 sampler,
    other kernels, ``rollout.max_staleness``). The mismatch diagnostics (``rollout_corr/*``) are
    logged in every run, with or without this block."""

    mode: Literal["decoupled", "bypass"] = Field(
        "decoupled",
        description="'decoupled' (verl bypass_mode: false): three policies; π_old is recomputed by the learner "
        "before the update, the weights and masks compare it with the sampler, and the objective's ratio is π_θ/π_old. "
        "'bypass' (verl bypass_mode: true): the sampler's log-probs are π_old (no recomputation), the objective's ratio "
        "π_θ/π_sampler is itself the importance weight (is_level refused), and the masks compare the current π_θ with "
        "the sampler in each micro-batch.",
    )
    is_level: Literal["token", "sequence"] | None = Field(
        None,
        description="Truncated importance sampling (verl rollout_is): 'token' weights each token by min(ρ_t, "
        "is_threshold), 'sequence' each row by min(∏ρ_t, is_threshold); decoupled mode only.",
    )
    is_threshold: float = Field(2.0, gt=1, description="TIS cap C (verl rollout_is_threshold); refused without is_level.")
    mis: RatioBandConfig | None = Field(
        None, description="Sequence MIS (verl seq_sum_k1): mask rows whose product of ratios ∏ρ_t leaves [low, high]."
    )
    geometric: RatioBandConfig | None = Field(
        None,
        description="Geo-RS (verl seq_mean_k1): mask rows whose geometric-mean ratio exp(mean log ρ_t) leaves "
        "[low, high] (length-independent; e.g. 0.999 / 1.001).",
    )
    k3_threshold: float | None = Field(
        None, gt=0, description="K3 rejection (verl seq_mean_k3): mask rows whose mean ρ−1−log ρ exceeds this."
    )
    icepop: RatioBandConfig | None = Field(
        None, description="ICEPOP (verl token_k1 with two bounds): mask tokens whose ratio ρ_t leaves [low, high]."
    )
    opsm_threshold: float | None = Field(
        None,
        ge=0,
        description="DeepSeek-V3.2's off-policy sequence masking: mask negative-advantage rows whose mean "
        "log π_sampler − log π_learner exceeds this (δ).",
    )

    @model_validator(mode="after")
    def _every_setting_acts(self) -> "RolloutCorrectionConfig":
        # is_threshold without is_level: refused with the other idle settings (polyrl/config/inert_settings.py).
        if self.mode == "bypass" and self.is_level is not None:
            raise ValueError(
                "mode 'bypass' uses the sampler's log-probs as π_old, so the objective's ratio π_θ/π_sampler is already "
                "the importance weight; is_level applies in mode 'decoupled' only; allowed here: is_level: null, or mode: decoupled"
            )
        return self

    def settings(self) -> Any:
        """The pure-maths settings (:class:`polyrl.algos.rollout_correction.CorrectionSettings`)."""
        from polyrl.algos.rollout_correction import CorrectionSettings

        def band(b: RatioBandConfig | None) -> tuple[float, float] | None:
            return None if b is None else (b.low, b.high)

        return CorrectionSettings(
            is_level=self.is_level,
            is_threshold=self.is_threshold,
            mis=band(self.mis),
            geometric=band(self.geometric),
            k3_threshold=self.k3_threshold,
            icepop=band(self.icepop),
            opsm_threshold=self.opsm_threshold,
        )

    @property
    def corrects(self) -> bool:
        """Whether it weights or masks anything (else it only picks the mode)."""
        return self.is_level is not None or self.settings().rejects


class AdaptiveEntropyConfig(StrictModel):
    """The entropy coefficient adapted toward a target entropy (polyrl/algos/entropy_control.py):
    after each step ``coef ← clip(coef + step_size·(target − H), 0, max_coef)``, starting from
    train.entropy_coef; logged as actor/entropy_coef."""

    target: float = Field(..., ge=0, description="Target mean token entropy (nats).")
    step_size: float = Field(..., gt=0, description="η: coefficient change per nat of entropy below the target, per step.")
    max_coef: float = Field(0.1, gt=0, description="The coefficient's upper bound.")


class HighEntropyTokensConfig(StrictModel):
    """Only the highest-entropy tokens keep their policy gradient (Wang et al., arXiv 2506.01939)."""

    top_ratio: float = Field(
        0.2,
        gt=0,
        le=1,
        description="ρ: the share of response tokens, by entropy, that train (the paper: 0.2); taken per micro-batch.",
    )


class ObjectiveConfig(StrictModel):
    """The learner's policy loss: a registered objective with its typed params and loss aggregation, and
    optional entropy control and rollout correction."""

    name: str = Field(
        "grpo",
        description="The policy objective, a registered name (`polyrl objectives list`; the list below under "
        "Objectives): it brings its own default advantage estimator, aggregation and typed params.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The objective's typed params (`polyrl objectives show NAME`); kl_coef, kl_estimator and entropy_coef live in train.",
    )
    aggregation: str | None = Field(None, description="Loss aggregation mode; default: the objective's own.")
    adaptive_entropy: AdaptiveEntropyConfig | None = Field(
        None, description="Adapt the entropy coefficient toward a target entropy (starts at train.entropy_coef)."
    )
    high_entropy_tokens: HighEntropyTokensConfig | None = Field(
        None, description="Gradient only through the top-ρ tokens by entropy (forking tokens)."
    )
    rollout_correction: RolloutCorrectionConfig | None = Field(
        None,
        description="Importance weights and rejection masks for a sampler that differs from the learner "
        "(docs/rollout_correction.md); null: none (the mismatch diagnostics are logged all the same).",
    )

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


def _yaml_false_is_off(value: Any) -> Any:
    """YAML 1.1 reads an unquoted ``off`` as ``false``; where "off" is an allowed value, that is what was meant
    (and ``true``, from an unquoted ``on``, stays a bool for the schema to refuse with the allowed values)."""
    return "off" if value is False else value


class DynamicSamplingConfig(StrictModel):
    """DAPO's dynamic sampling: drop groups whose rewards all agree, refill, bounded."""

    enabled: bool = Field(
        False,
        description="Drop every group whose scored rewards all agree (zero advantage, no gradient) and generate more "
        "prompts until the batch holds rollout.prompts_per_step informative groups (DAPO, arXiv 2503.14476, §3.2).",
    )
    max_rounds: int = Field(
        3,
        ge=1,
        description="Generation rounds per step at most (the first included); after them the batch keeps the informative "
        "groups it has, even if short or empty (logged as rollout/dynamic_sampling_missing_groups). Refused when written "
        "without enabled: true.",
    )


class OverlongConfig(StrictModel):
    """DAPO's overlong handling: soft punishment added to the reward, or masking truncated samples."""

    mode: Annotated[Literal["off", "soft_punishment", "mask_truncated"], BeforeValidator(_yaml_false_is_off)] = Field(
        "off",
        description="'soft_punishment': add DAPO's length penalty (0 up to L_max − L_cache tokens, falling linearly to "
        "−1 at L_max, −1 beyond; arXiv 2503.14476, Eq. 13) × penalty_weight to each sample's reward. 'mask_truncated': "
        "samples cut at rollout.max_tokens keep their place in the group statistics but leave the loss. 'off': neither. "
        "An unquoted YAML off (read as false) means 'off'.",
    )
    max_length: int | None = Field(
        None,
        ge=1,
        description="L_max of the soft punishment, in response tokens; default rollout.max_tokens; soft_punishment only.",
    )
    cache_length: int = Field(
        16,
        ge=0,
        description="L_cache: the soft punishment's ramp, in tokens before L_max (0: a step from 0 to −1 past L_max); "
        "soft_punishment only (refused when written with another mode).",
    )
    penalty_weight: float = Field(
        1.0,
        description="Multiplies the soft punishment before it is added to the reward; soft_punishment only (refused when "
        "written with another mode).",
    )


class AdvantageConfig(StrictModel):
    """How each sample's advantage is computed: the estimator (default: the objective's own) with its params,
    and DAPO's data-side options (dynamic sampling, overlong handling)."""

    estimator: str | None = Field(None, description="Advantage estimator; default: the objective's own.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="The estimator's typed params (`polyrl objectives show NAME --advantage`)."
    )
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    overlong: OverlongConfig = OverlongConfig()
    reward_aggregation: Literal["sum", "gdpo"] = Field(
        "sum",
        description="How several rewards[] enter the advantage. 'sum': the estimator sees their weighted total. 'gdpo': "
        "each reward is normalised within its group apart from the others, then weighted and summed, then normalised "
        "over the batch (GDPO, arXiv 2601.05242), so that reward combinations the total would tie stay apart; needs two "
        "or more rewards and the group_norm estimator with its group std (polyrl/algos/advantages/gdpo.py).",
    )

    @field_validator("estimator")
    @classmethod
    def _registered_estimator(cls, name: str | None) -> str | None:
        from polyrl.algos.advantages import list_advantages

        allowed = [spec.name for spec in list_advantages()]
        if name is not None and name not in allowed:
            raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(allowed)}")
        return name


class ModalityGAEConfig(StrictModel):
    """One modality's GAE discount and trace decay (Schulman et al., "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", arXiv 1506.02438)."""

    gamma: float = Field(
        ...,
        gt=0,
        le=1,
        description="γ: the discount applied at this modality's response tokens (estimators that use per-token "
        "discounts, i.e. GAE; group estimators ignore it).",
    )
    lam: float = Field(..., ge=0, le=1, description="λ: GAE's trace decay at this modality's response tokens.")


class ModalitiesConfig(StrictModel):
    """Per-modality GAE settings, polyrl's own design: each response token uses its own modality's γ/λ
    (GAE itself: arXiv 1506.02438). The defaults (text 0.95/0.9, image 0.85/0.8) are polyrl's heuristic,
    not a published recipe; group estimators (GRPO and the like) have no use for them, so writing them beside one
    is refused."""

    text: ModalityGAEConfig = ModalityGAEConfig(gamma=0.95, lam=0.9)
    image: ModalityGAEConfig = ModalityGAEConfig(gamma=0.85, lam=0.8)


def check_reward_aggregation(cfg: Any) -> list[tuple[tuple[str, ...], str, Any]]:
    """``advantage.reward_aggregation: gdpo`` against the rest of the config: ``(field path, message,
    value)`` for each refusal (:class:`polyrl.config.experiment.ExperimentConfig` raises them). GDPO
    decouples the rewards only where the advantage divides each group by its std (see
    :mod:`polyrl.algos.advantages.gdpo`), and it reads each reward's raw scores, so anything that
    changes the total alone (the overlong penalty, the KL in the reward, the dynamic-sampling filter)
    would be silently left out."""
    from polyrl.algos.advantages.gdpo import GDPO_ESTIMATORS
    from polyrl.algos.objectives import get_objective

    if cfg.advantage.reward_aggregation != "gdpo":
        return []
    path, allowed = ("advantage", "reward_aggregation"), "allowed here: reward_aggregation: sum (the default)"
    estimator = cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage
    params = cfg.advantage.params
    reasons = []
    if cfg.env is not None:
        reasons.append("env: episodes are scored by one reward, the environment's return")
    elif len(cfg.rewards) < 2:
        reasons.append(f"the run has {len(cfg.rewards)} reward, so there is nothing to normalise apart (two or more rewards[])")
    if estimator not in GDPO_ESTIMATORS:
        reasons.append(
            f"the advantage estimator is {estimator!r}, whose advantage does not depend on how rewards are combined "
            "(centring alone is linear; a critic learns the total's value); allowed: advantage.estimator: group_norm"
        )
    elif params.get("use_std") is False or params.get("std_scale") == "batch":
        reasons.append(
            "advantage.params turn off the group std (use_std: false or std_scale: batch), so each reward's group "
            "normalisation would be a centring, equal to centring the sum; allowed: use_std: true, std_scale: group"
        )
    if cfg.advantage.overlong.mode == "soft_punishment":
        reasons.append("advantage.overlong.mode 'soft_punishment' adds to the total only (no reward of its own here)")
    if cfg.train.kl_in_reward:
        reasons.append("train.kl_in_reward puts the KL into the total's token rewards only")
    if cfg.advantage.dynamic_sampling.enabled:
        reasons.append("advantage.dynamic_sampling keeps the groups whose totals differ, and drops groups that GDPO separates")
    if not reasons:
        return []
    return [(path, "'gdpo' cannot apply here: " + "; ".join(reasons) + "; " + allowed, "gdpo")]


def check_rollout_correction(cfg: Any) -> list[tuple[tuple[str, ...], str, Any]]:
    """Cross-section checks of the rollout correction: ``(field path, message, value)`` for each
    refusal (:class:`polyrl.config.experiment.ExperimentConfig` raises them)."""
    correction, rollout = cfg.objective.rollout_correction, cfg.rollout
    tis = rollout.truncated_importance_sampling.enabled
    errors: list[tuple[tuple[str, ...], str, Any]] = []
    if correction is not None and tis:
        errors.append(
            (
                ("rollout", "truncated_importance_sampling", "enabled"),
                "token TIS is also objective.rollout_correction (is_level: token); set one of them; allowed here: "
                "enabled: false beside objective.rollout_correction",
                True,
            )
        )
    stale = rollout.max_staleness >= 1
    if stale and correction is not None and correction.mode == "decoupled" and not correction.corrects:
        errors.append(
            (
                ("objective", "rollout_correction", "mode"),
                "mode 'decoupled' recomputes π_old at the learner's weights, so with rollout.max_staleness "
                f"{rollout.max_staleness} and neither is_level nor a rejection the samples' staleness would be ignored; "
                "allowed here: is_level token/sequence or a rejection (mis, geometric, k3_threshold, icepop, opsm_threshold), "
                "or mode: bypass",
                "decoupled",
            )
        )
    if stale and correction is None and not tis and cfg.sampling_dtype != cfg.model.dtype:
        # π_old is then the sampler's log-probs, so its rounding enters every ratio: harmless for a
        # PPO clip of 0.2, but GSPO's band of 3e-4 would start most sequences outside the clip.
        errors.append(
            (
                ("rollout", "dtype"),
                f"the sampler runs in {cfg.sampling_dtype} and the learner in {cfg.model.dtype} under rollout.max_staleness "
                f"{rollout.max_staleness}: π_old would be the sampler's log-probs, so its rounding would enter every "
                "ratio; allowed here: rollout.dtype equal to model.dtype, or objective.rollout_correction "
                "(mode: decoupled with is_level: token recomputes π_old in the learner's dtype; mode: bypass accepts the rounding)",
                cfg.sampling_dtype,
            )
        )
    return errors
