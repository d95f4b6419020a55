"""Pre-flight check of the training prompts, formatted and held to the sampler's own rule.

Every training row of a built-in source or a local data file is read and formatted exactly as
the sampler will (chat template, ``data.system_prompt``) with the policy's tokenizer, loaded
without its weights (:mod:`polyrl.policies.tokenizer_only`), and held to the sampler's own rule
(:func:`polyrl.data.prompt_lengths.checked_training_prompts`): a prompt that leaves the policy no
position for a response, or an empty prompt or user turn, is refused here with the run's message
(docs/bad-input.md). Image rows are left to the run (their lengths are not counted; their images are
checked by :mod:`polyrl.launch.preflight_images`), as are dataset names and a GGUF policy not yet
converted into the model cache.
"""

from __future__ import annotations

from pathlib import Path

from polyrl.config.schema import ExperimentConfig
from polyrl.data.prompt_lengths import checked_training_prompts
from polyrl.data.prompts import BUILTIN_SOURCES, DataConfigError, may_have_images
from polyrl.policies.tokenizer_only import policy_tokenizer
from polyrl.trainer.build_data import chat_format, training_rows

__all__ = ["prompt_problem"]


def prompt_problem(config: ExperimentConfig, checked: dict[str, str | None]) -> str | None:
    """The sampler's refusal of the training prompts (too long for the policy, empty), found before
    any MLflow run or model weights exist; once per distinct data, model and max_model_len."""
    data = config.data
    if data.source not in BUILTIN_SOURCES and not Path(data.source).expanduser().exists():
        return None  # a dataset name: left to the loader, as above
    if may_have_images(data.source, data.train_split, images_field=data.images_field):
        return None
    key = f"{data.model_dump_json()}|{config.model.model_dump_json()}|{config.rollout.max_model_len}"
    if key not in checked:
        checked[key] = None
        try:
            policy = policy_tokenizer(config.model)
        except Exception as error:  # noqa: BLE001 - the run's own tokenizer load would fail the same way
            field = "model.path" if config.model.path else "model.builtin"
            checked[key] = f"{field}: the policy's tokenizer does not load: {type(error).__name__}: {error}"
            return checked[key]
        if policy is not None:
            try:
                checked_training_prompts(
                    training_rows(config),
                    policy.tokenizer,
                    chat_format(config),
                    max_model_len=config.rollout.max_model_len,
                    model_dir=policy.folder,
                    positions=policy.positions,
                    source=data.source,
                    model=policy.name,
                )
            except DataConfigError as error:
                message = str(error)
                checked[key] = message if message.startswith("data.") else f"data.source: {message}"
    return checked[key]
