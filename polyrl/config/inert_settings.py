"""Settings that would do nothing where they are written, refused (the house rule: every accepted
setting does something or is refused; docs/bad-input.md lists what is refused and when).

Each :class:`Inert` rule names a field, when it has no effect (``idle``: the feature it tunes is
off) and why. A field written in the YAML (pydantic's ``model_fields_set``, so a default never
trips a rule) while its rule is idle is refused by :class:`polyrl.config.experiment.ExperimentConfig`
with its field path, the reason and what is allowed.

Except where a later layer of the file turned the feature off: an arm (or ``--set``) that changes
the setting a field depends on (its ``SWITCHES``) while the field comes from the base keys (or an
arm) is an ablation (``arms: {no_ds: {advantage.dynamic_sampling.enabled: false}}``, ``--set
eval.every=0``, a GRPO arm beside a PPO base with ``train.value``), so the base's setting is kept
for the arms where it acts. Written in the same layer as the switch, it is refused.

:func:`drop_idle` removes the idle fields from a dumped config (``to_yaml``), so a resolved config
read back (a Ray arm, a ``resolved_config.yaml`` run again) carries only what acts and validates
again.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.config.distill import teacher_uses_cache
from polyrl.config.model import TINY_POLICY_KEYS

__all__ = ["Inert", "INERT_SETTINGS", "SWITCHES", "drop_idle", "inert_refusals", "switched_off_later"]


def _estimator_requires(cfg: Any) -> tuple[str, ...]:
    from polyrl.algos.advantages import get_advantage
    from polyrl.algos.objectives import get_objective

    return get_advantage(cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage).requires


def _estimator_name(cfg: Any) -> str:
    from polyrl.algos.objectives import get_objective

    return cfg.advantage.estimator or f"{get_objective(cfg.objective.name).default_advantage} (objective {cfg.objective.name}'s)"


@dataclass(frozen=True)
class Inert:
    path: tuple[str, ...]
    idle: Callable[[Any], bool]  # the experiment config -> whether the field does nothing now
    why: Callable[..., str]  # the refusal, after "<path>: set, but "; ends with what is allowed
    acts: Callable[[Any], bool] = lambda value: True  # values that would act (e.g. kl_in_reward: false never does)
    refused_here: bool = True  # False: refused by its own section's check (named there); only dropped from dumps here


INERT_SETTINGS: tuple[Inert, ...] = (
    Inert(
        ("model", "builtin"),
        lambda c: c.model.path is not None,
        lambda c: (
            f"model.path {c.model.path!r} is the policy, so no built-in one is built; allowed here: model.path "
            "or model.builtin, not both"
        ),
    ),
    Inert(
        ("model", "cache_dir"),
        # A .gguf path is converted into the cache (polyrl.policies.pretrained.is_gguf_path: the same suffix rule);
        # so is a distillation teacher's built-in or .gguf model, and a run's exported checkpoint.
        lambda c: c.model.path is not None and Path(c.model.path).suffix.lower() != ".gguf" and not teacher_uses_cache(c.distill),
        lambda c: (
            f"model.path {c.model.path!r} is a model folder, used where it is; the cache holds built-in "
            "policies, converted .gguf files and a distillation teacher's; allowed here: no cache_dir"
        ),
        acts=lambda value: value is not None,
    ),
    Inert(
        ("train", "kl_in_reward"),
        lambda c: c.train.kl_coef == 0,
        lambda c: (
            "train.kl_coef is 0, so there is no KL to put in the reward (no reference model is loaded); "
            "allowed here: kl_coef > 0, or kl_in_reward: false"
        ),
        acts=lambda value: value is True,
    ),
    Inert(
        ("train", "kl_estimator"),
        lambda c: c.train.kl_coef == 0,
        lambda c: (
            "train.kl_coef is 0, so no KL is estimated (no reference model is loaded); allowed here: "
            "kl_coef > 0, or no kl_estimator"
        ),
    ),
    Inert(
        ("train", "min_lr_ratio"),
        lambda c: c.train.lr_schedule == "constant",
        lambda c: (
            "train.lr_schedule is 'constant', which never decays to it; allowed here: lr_schedule linear or "
            "cosine, or no min_lr_ratio"
        ),
    ),
    Inert(
        ("train", "value"),
        lambda c: "values" not in _estimator_requires(c),
        lambda c: (
            f"the advantage estimator {_estimator_name(c)} uses no critic, so none is built; allowed here: "
            "an estimator with a critic (advantage.estimator: gae), or no train.value"
        ),
    ),
    *(
        Inert(
            ("advantage", "overlong", name),
            lambda c: c.advantage.overlong.mode != "soft_punishment",
            lambda c, name=name: (
                f"advantage.overlong.mode is {c.advantage.overlong.mode!r}; it tunes the soft "
                "punishment only; allowed here: mode: soft_punishment, or no " + name
            ),
            acts=lambda value: value is not None,
        )
        for name in ("max_length", "cache_length", "penalty_weight")
    ),
    Inert(
        ("advantage", "dynamic_sampling", "max_rounds"),
        lambda c: not c.advantage.dynamic_sampling.enabled,
        lambda c: (
            "advantage.dynamic_sampling.enabled is false, so there is one generation round per step; "
            "allowed here: enabled: true, or no max_rounds"
        ),
    ),
    Inert(
        ("rollout", "kv_cache_gb"),
        # In-run evaluation and rollout workers use the run's own engine, so nothing else sizes a cache from it.
        lambda c: c.rollout.engine != "vllm",
        lambda c: (
            f"rollout.engine is {c.rollout.engine!r}, which keeps no vLLM KV cache to size; allowed here: "
            "engine: vllm, or kv_cache_gb: auto (or unset)"
        ),
        acts=lambda value: value != "auto",
    ),
    Inert(
        ("rollout", "truncated_importance_sampling", "cap"),
        lambda c: not c.rollout.truncated_importance_sampling.enabled,
        lambda c: (
            "rollout.truncated_importance_sampling.enabled is false, so no importance weight is capped; "
            "allowed here: enabled: true, or no cap"
        ),
    ),
    Inert(
        ("objective", "rollout_correction", "is_threshold"),
        lambda c: c.objective.rollout_correction.is_level is None,
        lambda c: (
            "objective.rollout_correction.is_level is null, so no importance weight is capped; allowed here: "
            "is_level: token or sequence, or no is_threshold"
        ),
    ),
    Inert(
        ("modalities",),
        lambda c: "gammas" not in _estimator_requires(c),
        lambda c: (
            f"the advantage estimator {_estimator_name(c)} takes no per-token discounts (a group estimator); "
            "the per-modality γ/λ are GAE's; allowed here: advantage.estimator: gae, or no modalities"
        ),
    ),
    *(
        Inert(
            ("eval", name),
            lambda c: c.eval.every == 0,
            lambda c, name=name: (
                "eval.every is 0 (never), so no evaluation runs in training; allowed here: every > 0, or no " + name
            ),
            acts=lambda value: value is not None,
        )
        for name in ("suite", "limit")
    ),
    Inert(
        ("eval", "every"),
        lambda c: c.eval.suite is None,
        lambda c: (
            f"eval.suite is not set, so every {c.eval.every} steps nothing is evaluated; allowed here: "
            "eval.suite (a YAML path or suite name), or every: 0"
        ),
        acts=lambda value: value != 0,
    ),
    # Refused where they are checked already (config/model.py, config/episodes.py); listed so that
    # a dumped config leaves them out and validates again.
    *(
        Inert(("model", "builtin", name), lambda c: c.model.builtin.name is not None, lambda c: "", refused_here=False)
        for name in TINY_POLICY_KEYS
    ),
    Inert(("rewards",), lambda c: c.env is not None, lambda c: "", refused_here=False),
    Inert(
        ("health", "held_out_metric"),
        lambda c: not (c.eval.every and c.eval.suite),
        lambda c: (
            "it is checked against periodic evaluation, which this run does not do; allowed here: "
            "eval.every > 0 with eval.suite, or no held_out_metric"
        ),
        acts=lambda value: value is not None,
    ),
)


# The settings that make each field act (dotted paths): a later layer writing one of them exempts the field.
SWITCHES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("model", "builtin"): ("model.path",),
    ("model", "cache_dir"): ("model.path",),
    ("train", "kl_in_reward"): ("train.kl_coef",),
    ("train", "kl_estimator"): ("train.kl_coef",),
    ("train", "min_lr_ratio"): ("train.lr_schedule",),
    ("train", "value"): ("objective.name", "advantage.estimator"),
    ("modalities",): ("objective.name", "advantage.estimator"),
    ("advantage", "overlong", "max_length"): ("advantage.overlong.mode",),
    ("advantage", "overlong", "cache_length"): ("advantage.overlong.mode",),
    ("advantage", "overlong", "penalty_weight"): ("advantage.overlong.mode",),
    ("advantage", "dynamic_sampling", "max_rounds"): ("advantage.dynamic_sampling.enabled",),
    ("rollout", "truncated_importance_sampling", "cap"): ("rollout.truncated_importance_sampling.enabled",),
    ("rollout", "kv_cache_gb"): ("rollout.engine",),
    ("objective", "rollout_correction", "is_threshold"): ("objective.rollout_correction.is_level",),
    ("eval", "suite"): ("eval.every",),
    ("eval", "limit"): ("eval.every",),
    ("eval", "every"): ("eval.suite",),
    ("health", "held_out_metric"): ("eval.every", "eval.suite"),
}


def _written(layer: Any, path: tuple[str, ...]) -> bool:
    for part in path:
        if not isinstance(layer, dict) or part not in layer:
            return False
        layer = layer[part]
    return True


def _last_layer(layers: list[dict[str, Any]], path: tuple[str, ...]) -> int:
    return max((index for index, layer in enumerate(layers) if _written(layer, path)), default=-1)


def switched_off_later(layers: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    """The fields whose switch a later layer wrote than the field itself (``layers``: the base
    keys, the arm's, ``--set``'s, nested, lowest precedence first): exempt from the refusal."""
    exempt = set()
    for path, switches in SWITCHES.items():
        field = _last_layer(layers, path)
        if field >= 0 and max(_last_layer(layers, tuple(s.split("."))) for s in switches) > field:
            exempt.add(path)
    return exempt


def _owner(cfg: Any, path: tuple[str, ...]) -> Any:
    for part in path[:-1]:
        cfg = getattr(cfg, part) if cfg is not None else None
    return cfg


def inert_refusals(cfg: Any, exempt: AbstractSet[tuple[str, ...]] = frozenset()) -> list[tuple[tuple[str, ...], str, Any]]:
    """``(field path, message, value)`` for every field written in the YAML that does nothing here
    (but those in ``exempt``, :func:`switched_off_later`)."""
    refusals = []
    for rule in INERT_SETTINGS:
        if rule.path in exempt:
            continue
        owner, name = _owner(cfg, rule.path), rule.path[-1]
        if owner is None:  # an optional block that is absent
            continue
        value = getattr(owner, name)
        if rule.refused_here and name in owner.model_fields_set and rule.acts(value) and rule.idle(cfg):
            shown = value if not hasattr(value, "model_dump") else value.model_dump(mode="json")
            refusals.append((rule.path, f"set, but {rule.why(cfg)}", shown))
    return refusals


def drop_idle(cfg: Any, dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` (``cfg.model_dump(mode="json")``) without the fields whose rule is idle in ``cfg``
    (they are defaults there: a written one is refused), so that it validates again."""
    for rule in INERT_SETTINGS:
        owner: Any = dumped  # a section of the dump, or None where the path leaves it
        for part in rule.path[:-1]:
            owner = owner.get(part) if isinstance(owner, dict) else None
        if isinstance(owner, dict) and rule.path[-1] in owner and rule.acts(owner[rule.path[-1]]) and rule.idle(cfg):
            del owner[rule.path[-1]]
    return dumped
