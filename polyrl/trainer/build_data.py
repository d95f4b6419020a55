"""Building an arm's inputs from its config: the training prompts (read, images checked, chat
formatted with the policy's tokenizer, behind a seeded sampler) and the rewards that score them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.data.chat import ChatFormat
from polyrl.data.image_rows import ImageCheck, check_model_takes_images
from polyrl.data.mixtures import MixtureSampler, tag_samples
from polyrl.data.prompt_lengths import checked_training_prompts
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import load_prompt_dataset
from polyrl.data.sampler import PromptSampler
from polyrl.rewards import CompositeReward, load_reward_class

__all__ = ["accuracy_label", "build_rewards", "build_sampler", "chat_format", "reward_specs", "training_rows"]


def chat_format(cfg: ExperimentConfig) -> ChatFormat:
    """How the training prompts are formatted (:mod:`polyrl.data.chat`)."""
    return ChatFormat(cfg.data.chat_template, cfg.data.system_prompt, cfg.data.messages_field)


def training_rows(cfg: ExperimentConfig) -> list[Any]:
    """The training split's prompts as the data gives them (chat rows may carry messages instead
    of a prompt); every row's images are checked and decoded. A mixture (``data.sources``): each
    source's rows in turn, each tagged with its source's name (:mod:`polyrl.data.mixtures`)."""
    if cfg.data.sources:
        rows: list[Any] = []
        for source in cfg.data.sources:
            one = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": source.source, "sources": None})})
            rows += tag_samples(training_rows(one), source.label, source=source.source)
        return rows
    data = cfg.data
    fields = dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        references_field=data.references_field,
        images_field=data.images_field,
        messages_field=chat_format(cfg).rows_messages_field,
    )
    dataset = load_prompt_dataset(
        data.source,
        data.train_split,
        limit=data.limit,
        holdout=data.holdout,
        images=ImageCheck(max_pixels=data.max_image_pixels),
        **fields,
    )
    return rows_to_prompt_samples(dataset, max_image_pixels=data.max_image_pixels, **fields)


def build_sampler(cfg: ExperimentConfig, rows: list[Any], policy_path: Path, tokenizer: Any) -> PromptSampler | MixtureSampler:
    """The seeded sampler over ``rows``, once the policy is known to take their images; chat
    prompts are formatted here, once, with the policy's tokenizer (:mod:`polyrl.data.chat`)."""
    check_model_takes_images(policy_path, rows, images_field=cfg.data.images_field)
    # Refused, not cut (a cut prompt would train on a question the data never asked); the same
    # check as the pre-flight's (launch/preflight_prompts.py), so validate refuses what run would.
    samples = checked_training_prompts(
        rows,
        tokenizer,
        chat_format(cfg),
        max_model_len=cfg.rollout.max_model_len,
        model_dir=policy_path,
        source=cfg.data.source if not cfg.data.sources else ", ".join(s.source for s in cfg.data.sources),
        model=str(policy_path),
    )
    if cfg.data.sources:
        return MixtureSampler.from_config(samples, cfg.data.sources, seed=cfg.seed)
    return PromptSampler(samples, seed=cfg.seed)


def reward_specs(
    config: ExperimentConfig, policy_path: str | Path, training_references: list[list[str]] | None = None
) -> list[Any]:
    """The reward specs, with the policy's folder for a reward that declares it scores with it
    (``policy_path_param`` on its class, e.g. ``ppl_fluency``'s ``model_path``) and was given none
    (and a built-in pretrained model's folder where that parameter names one, ``smollm2-135m-instruct``),
    and the training prompts' references for one that declares a corpus parameter
    (``training_references_param``, e.g. ``cider``'s ``corpus_references``) and was given none."""
    from polyrl.policies.pretrained import PRETRAINED, pretrained_dir

    specs = []
    for spec in config.rewards:
        cls = load_reward_class(spec.module)
        param = getattr(cls, "policy_path_param", None)
        if param and param not in spec.params:
            spec = spec.model_copy(update={"params": {**spec.params, param: str(policy_path)}})
        elif param and isinstance(spec.params[param], str) and spec.params[param] in PRETRAINED:
            # The parameter takes a model folder; a built-in model's name is its cached folder (converted once).
            folder = pretrained_dir(spec.params[param], config.model.cache_dir)
            spec = spec.model_copy(update={"params": {**spec.params, param: str(folder)}})
        corpus = getattr(cls, "training_references_param", None)
        if corpus and corpus not in spec.params and training_references:
            spec = spec.model_copy(
                update={"params": {**spec.params, corpus: [list(refs) for refs in training_references if refs]}}
            )
        specs.append(spec)
    return specs


def accuracy_label(config: ExperimentConfig, labels: list[str]) -> str | None:
    """The reward that defines ``train/accuracy``: ``tracking.accuracy_reward``, else the one
    labelled ``accuracy`` (the field's documented default), else none (no accuracy metric)."""
    wanted = config.tracking.accuracy_reward
    if wanted is None:
        return "accuracy" if "accuracy" in labels else None
    if wanted not in labels:
        raise ConfigError(f"tracking.accuracy_reward: no reward is labelled {wanted!r}; reward labels: {', '.join(labels)}")
    return wanted


def build_rewards(
    cfg: ExperimentConfig, policy_path: Path, sampler: PromptSampler | MixtureSampler
) -> tuple[CompositeReward, str | None]:
    """The arm's rewards, set up, and the label of the one that defines ``train/accuracy``."""
    rewards = CompositeReward(reward_specs(cfg, policy_path, [sample.references for sample in sampler.samples]))
    rewards.setup()
    return rewards, accuracy_label(cfg, rewards.labels)
