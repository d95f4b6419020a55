"""Pre-flight checks of chat formatting: the chat settings (``data.chat_template``,
``data.system_prompt``, chat rows) against the policy's tokenizer files, and an environment's
episodes rendered through its chat template (``env.tool_format``, ``env.tool_parser``), seen
without loading the policy's weights. The same rules as the run's own refusals, so that
``polyrl validate`` refuses what ``polyrl run`` would."""

from __future__ import annotations

import json
from pathlib import Path

from polyrl.config.schema import ExperimentConfig
from polyrl.data.prompts import BUILTIN_SOURCES, DataConfigError, check_prompt_source, load_prompt_dataset, source_has_images
from polyrl.policies.pretrained import is_gguf_path
from polyrl.policies.tokenizer_only import policy_tokenizer

__all__ = ["chat_problems", "env_problems", "has_chat_template", "policy_chat_template", "rows_carry_messages"]


def chat_problems(config: ExperimentConfig) -> list[str]:
    """Chat settings that cannot apply, from what is cheap to see: the settings, the policy's
    tokenizer files and the first row of the data. The same rules as the run's own refusal when
    the prompts are formatted (polyrl/data/chat.py ``format_prompts``), so that ``validate`` refuses
    what ``run`` would, before any MLflow run exists or any model loads."""
    data, problems = config.data, []
    in_effect = data.chat_template if data.chat_template is not None else rows_carry_messages(config)
    if data.system_prompt is not None and in_effect is False:
        problems.append(
            f"data.system_prompt: set, but prompts are not formatted through a chat template (data.chat_template is "
            f"{str(data.chat_template).lower() if data.chat_template is not None else 'unset'}, the rows have no "
            f"{data.messages_field!r} column); set data.chat_template: true, or remove system_prompt"
        )
    if not in_effect:
        return problems
    policy, has_template = policy_chat_template(config)
    if has_template is False:
        if data.chat_template is True:
            problems.append(
                f"data.chat_template: true, but the tokenizer of {policy} has no chat template; allowed: "
                "chat_template: false, or a model whose tokenizer has one"
            )
        else:
            problems.append(
                f"data.messages_field: the rows of data.source {data.source!r} carry a {data.messages_field!r} column, "
                f"which is formatted through the tokenizer's chat template, but the tokenizer of {policy} has none; give "
                "the rows a prompt column and set data.chat_template: false, or use a model whose tokenizer has a template"
            )
    try:
        images = source_has_images(data.source, data.train_split, images_field=data.images_field)
    except DataConfigError:  # a broken source is reported by the data check
        images = False
    if images:
        problems.append(
            f"data.chat_template: the rows of data.source {data.source!r} have images; image prompts are built by the "
            "model's processor, not a chat template, here; allowed for image data: chat_template: false"
        )
    return problems


def env_problems(config: ExperimentConfig) -> list[str]:
    """What the episode runner would refuse when it starts (polyrl/rollout/chat_render.py), seen
    from the policy's tokenizer files without its weights: ``env:`` with a policy whose tokenizer
    has no chat template, and tool settings the template disagrees with (``env.tool_format:
    template`` where it renders no tools, an ``env.tool_parser`` other than the format it asks
    for). The tokenizer is loaded only for the latter, where the settings are not ``auto``."""
    env = config.env
    if env is None:
        return []
    policy, has_template = policy_chat_template(config)
    if has_template is False:
        return [
            f"env: episodes are rendered through the policy's chat template, but the tokenizer of {policy} has none; "
            "use a model whose tokenizer has one"
        ]
    if env.tool_format != "template" and env.tool_parser == "auto":
        return []  # auto falls back to the plain-text protocol: nothing to refuse
    from polyrl.envs import EnvConfigError, build_env, load_env_class
    from polyrl.rollout.chat_render import ChatRenderer

    try:
        tools = list(getattr(build_env(load_env_class(env.module), dict(env.params), ref=env.module), "tools", []) or [])
        loaded = policy_tokenizer(config.model)
    except Exception:  # noqa: BLE001 - a broken environment or tokenizer is reported by its own check, or by the run
        return []
    if loaded is None or not tools:
        return []
    try:
        ChatRenderer(loaded.tokenizer, tools, env.tool_format, config.data.system_prompt, tool_parser=env.tool_parser)
    except EnvConfigError as error:
        return [f"{error} (the chat template of {loaded.name})"]
    return []


def rows_carry_messages(config: ExperimentConfig) -> bool | None:
    """Whether the training rows carry ``data.messages_field`` (chat rows), from the first row;
    None where that is not cheap to see (a dataset name) or the source is broken (reported apart)."""
    data = config.data
    try:
        if data.source in BUILTIN_SOURCES:
            rows = load_prompt_dataset(data.source, data.train_split, limit=1, messages_field=data.messages_field)
            return data.messages_field in rows.column_names
        if not Path(data.source).is_file():  # a folder or a dataset name: left to the loader
            return None
        # The first row is checked for the messages column as if it were the prompt column.
        check_prompt_source(data.source, data.train_split, prompt_field=data.messages_field, holdout=data.holdout)
        return True
    except DataConfigError as error:
        return False if f"prompt field {data.messages_field!r}" in str(error) else None


def policy_chat_template(config: ExperimentConfig) -> tuple[str, bool | None]:
    """The policy in words and whether its tokenizer has a chat template (None: not known before it loads)."""
    model = config.model
    if model.path and not is_gguf_path(model.path):
        folder = Path(model.path)
        known = has_chat_template(folder) if (folder / "config.json").is_file() else None
        return f"model.path {model.path!r}", known
    if model.path:
        return f"model.path {model.path!r}", None  # a GGUF file's template is read when it is converted
    if model.builtin.name is not None:
        return f"model.builtin.name {model.builtin.name!r}", None
    # The tiny built-in policies' tokenizers (policies/text.py, vlm.py, drawing.py) carry no template.
    return f"the built-in policy (model.builtin.task {model.builtin.task!r})", False


def has_chat_template(model_dir: str | Path) -> bool:
    """Whether a model folder's tokenizer carries a chat template (the files transformers reads it from)."""
    folder = Path(model_dir)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = folder / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template")) if config.is_file() else False
    except (OSError, ValueError):
        return True  # unreadable here: leave the verdict to the tokenizer itself when the prompts are formatted
