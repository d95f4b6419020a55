"""What ``polyrl validate`` and the start of ``polyrl run`` check without training.

Each arm's reward modules are loaded and constructed (not set up: heavy resources load in
``setup``), the model folder and the first row of the data are looked at, so a broken reward
file, a folder without a tokenizer or a data file without the prompt field is one message in a
second — before any MLflow run is created or any model loads. Like verl's and TRL's config
checks, only what is cheap is checked here; dataset names (the Hub) are left to the loader.

One check reads every row: a local data file with an image column has each image of the rows
an arm trains on (``data.limit``, ``data.holdout``) opened and decoded, and its size held
against ``data.max_image_pixels``, once per distinct data setting, and how many images that was
and how long it took is said. It costs what the arm's own data load costs (that load decodes
every image too, :class:`polyrl.data.sampler.PromptSampler`), and spares a run that would fail
on row 9,000 after its MLflow runs exist and its policy has loaded.

And every training row of a built-in source or a local data file is read and formatted exactly
as the sampler will (chat template, ``data.system_prompt``) with the policy's tokenizer, loaded
without its weights (:mod:`polyrl.policies.tokenizer_only`), and held to the sampler's own rule
(:func:`polyrl.data.prompt_lengths.checked_training_prompts`): a prompt that leaves the policy no
position for a response, or an empty prompt or user turn, is refused here with the run's message
(docs/bad-input.md). Image rows are left to the run (their lengths are not counted; their images are
checked above), as are dataset names and a GGUF policy not yet converted into the model cache.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import ConfigError, ExperimentConfig, load_experiment
from polyrl.data.image_rows import ImageCheck
from polyrl.data.prompt_lengths import checked_training_prompts
from polyrl.data.prompts import (
    BUILTIN_SOURCES,
    DataConfigError,
    check_prompt_source,
    load_prompt_dataset,
    may_have_images,
    source_has_images,
)
from polyrl.engines.image_prompts import model_takes_images
from polyrl.policies.paths import check_model_dir
from polyrl.policies.pretrained import is_gguf_path, packaged_gguf
from polyrl.policies.tokenizer_only import policy_tokenizer
from polyrl.rewards import RewardConfigError, RewardSpec
from polyrl.rewards.base import module_label
from polyrl.rewards.registry import bind_params, build_reward
from polyrl.runtime.devices import LearnerDeviceError, learner_device
from polyrl.trainer.build_data import chat_format, training_rows

# Built-in policies that read images (config.schema.BuiltinModelConfig.task).
IMAGE_TASKS = ("vqa", "caption")
EMPTY_REWARDS = "rewards: the list is empty; an experiment needs at least one reward module, e.g. rewards: [{module: accuracy}]"


def reward_problems(specs: list[RewardSpec], *, model_path: str | None = None) -> list[str]:
    """One line per reward that cannot be built, each starting with its field path."""
    if not specs:
        return [EMPTY_REWARDS]
    problems: list[str] = []
    labels: dict[str, int] = {}
    for index, spec in enumerate(specs):
        try:
            cls = spec.resolve()
        except RewardConfigError as error:
            problems.append(f"rewards[{index}].module: {error}")
            continue
        label = spec.name or module_label(cls)
        if label in labels:
            problems.append(
                f"rewards[{index}]: labelled {label!r} like rewards[{labels[label]}]; give one of them a distinct 'name'"
            )
        labels.setdefault(label, index)
        params = dict(spec.params)
        # A reward that declares policy_path_param gets the policy's folder there in training
        # (trainer/build_data.py); without a model.path that folder is only known once the built-in
        # policy is built.
        param = getattr(cls, "policy_path_param", None)
        injected = bool(param) and param not in params
        if injected:
            params[param] = model_path or "<built-in policy>"
        try:
            bind_params(cls, params, ref=spec.module, label=label)
            if not injected or model_path:
                build_reward(cls, params, ref=spec.module, label=label)
        except RewardConfigError as error:
            problems.append(f"rewards[{index}]: {error}")
    return problems


def accuracy_problems(config: ExperimentConfig, labels: list[str]) -> list[str]:
    wanted = config.tracking.accuracy_reward
    if wanted is None or wanted in labels:
        return []
    return [f"tracking.accuracy_reward: no reward is labelled {wanted!r}; reward labels: {', '.join(labels)}"]


def reward_labels(specs: list[RewardSpec]) -> list[str]:
    labels = []
    for spec in specs:
        try:
            labels.append(spec.name or module_label(spec.resolve()))
        except RewardConfigError:
            continue
    return labels


def arm_problems(config: ExperimentConfig, *, runs_here: bool = False) -> list[str]:
    """``runs_here``: the arm will run on this machine (``polyrl run``), so its devices are checked
    too, and the vLLM build against the policy (:func:`vllm_kernel_problems`)."""
    # A .gguf model.path becomes a folder only when the run converts it, as a built-in policy is built.
    folder = config.model.path if not is_gguf_path(config.model.path) else None
    problems = reward_problems(list(config.rewards), model_path=folder)
    if runs_here:
        try:
            learner_device(config.train.device)
        except LearnerDeviceError as error:
            problems.append(str(error))
        problems += vllm_kernel_problems(config, folder)
    problems += accuracy_problems(config, reward_labels(list(config.rewards)))
    if config.model.path:
        try:
            check_model_dir(config.model.path)
        except ConfigError as error:
            problems.append(str(error))
    elif config.model.builtin.name is not None:
        try:
            packaged_gguf(config.model.builtin.name)
        except ConfigError as error:
            problems.append(str(error))
    try:
        messages_field = None if config.data.chat_template is False else config.data.messages_field
        for index, source in enumerate(config.data.sources or []):  # a mixture: each source, by its place
            try:
                check_prompt_source(source.source, config.data.train_split, prompt_field=config.data.prompt_field,
                                    holdout=config.data.holdout, messages_field=messages_field)  # fmt: skip
            except DataConfigError as error:
                problems.append(f"data.sources[{index}].source: {error}")
        if config.data.sources:
            return problems + chat_problems(config) + padding_free_problems(config) + env_problems(config)
        check_prompt_source(
            config.data.source,
            config.data.train_split,
            prompt_field=config.data.prompt_field,
            holdout=config.data.holdout,
            messages_field=messages_field,
        )
        problems += image_problems(config)
    except DataConfigError as error:
        problems.append(f"data.source: {error}")
    return problems + chat_problems(config) + padding_free_problems(config) + env_problems(config)


def vllm_kernel_problems(config: ExperimentConfig, folder: str | None) -> list[str]:
    """``rollout.engine: vllm`` with a policy folder whose vLLM class needs a compiled kernel this
    vLLM build lacks (Jamba's Mamba-1 scan on vLLM's CPU build, polyrl/engines/vllm_kernels.py):
    vLLM would start it and fail at the first generate. Checked only for an arm that runs here,
    and only for a config.json with state-space settings (vLLM is imported to look the class up,
    which an attention-only policy, or ``polyrl validate``, should not pay for)."""
    if config.rollout.engine != "vllm" or not folder or not _declares_state_space(Path(folder, "config.json")):
        return []
    try:
        from polyrl.engines.vllm_kernels import missing_vllm_kernel

        missing = missing_vllm_kernel(folder)
    except ImportError:  # no vLLM here: the engine's start reports that
        return []
    if missing is None:
        return []
    return [f"rollout.engine: vllm cannot sample from model.path {folder!r}: {missing}; allowed here: rollout.engine: hf"]


def _declares_state_space(config_file: Path) -> bool:
    """Whether a model's config.json carries state-space settings (``state_size``, ``mamba_*``,
    ``ssm_*``, ``*_d_state``, in it or its ``text_config``): the only policies the vLLM kernel
    check can refuse."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # reported by check_model_dir
    if not isinstance(config, dict):
        return False
    keys = [*config, *(config.get("text_config") or {})] if isinstance(config.get("text_config", {}), dict) else [*config]
    return any(key == "state_size" or "mamba" in key or "ssm" in key or key.endswith("d_state") for key in map(str, keys))


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


def padding_free_problems(config: ExperimentConfig) -> list[str]:
    """``train.padding_free: true`` with an image-text policy: refused by the run when the policy
    loads (polyrl/modeling/packing.py), here before."""
    if config.train.padding_free is not True:
        return []
    model = config.model
    if model.path and not is_gguf_path(model.path):
        images = Path(model.path, "config.json").is_file() and model_takes_images(model.path)
        policy = f"model.path {model.path!r} is an image-text model (its config.json has a vision_config)"
    else:
        images = not model.path and model.builtin.name is None and model.builtin.task in IMAGE_TASKS
        policy = f"model.builtin.task {model.builtin.task!r} is an image-text policy"
    if not images:
        return []
    return [
        f"train.padding_free: true, but {policy}; padding-free rows are for text policies only (image features are "
        "placed by padded rows); allowed here: padding_free: false or auto"
    ]


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


def image_problems(config: ExperimentConfig) -> list[str]:
    """Image data for a text-only policy, found before any model loads (the full per-row check
    runs when the data loads)."""
    data, model = config.data, config.model
    if not source_has_images(data.source, data.train_split, images_field=data.images_field):
        return []
    if model.path and is_gguf_path(model.path):
        policy = f"model.path {model.path!r} is a GGUF causal LM, a text-only model"
    elif model.path:
        if not Path(model.path, "config.json").is_file() or model_takes_images(model.path):
            return []
        policy = f"model.path {model.path!r} is a text-only model (its config.json has no vision_config)"
    elif model.builtin.name is not None:
        policy = f"model.builtin.name {model.builtin.name!r} is a text-only policy"
    elif model.builtin.task in IMAGE_TASKS:
        return []
    else:
        policy = f"model.builtin.task {model.builtin.task!r} is a text-only policy"
    rows = "its rows have" if data.source in BUILTIN_SOURCES else "row 0 has"
    return [
        f"data.source {data.source!r}: {rows} image(s) (field {data.images_field!r}) but {policy}; use an image-text model "
        f"(model.builtin.task: {' or '.join(IMAGE_TASKS)}, or an image-text model.path) or text-only data"
    ]


ImageRows = dict[tuple, tuple[str | None, ImageCheck, float]]  # data settings -> (problem, what was checked, seconds)


def image_row_problem(config: ExperimentConfig, checked: ImageRows) -> str | None:
    """Open and decode every image of the rows the arm trains on (once per distinct data setting)."""
    data = config.data
    if not may_have_images(data.source, data.train_split, images_field=data.images_field):
        return None
    key = (data.source, data.train_split, data.prompt_field, data.images_field, data.limit, data.holdout, data.max_image_pixels)
    if key not in checked:
        check, started, problem = ImageCheck(max_pixels=data.max_image_pixels, decode=True), time.perf_counter(), None
        try:
            load_prompt_dataset(
                data.source,
                data.train_split,
                prompt_field=data.prompt_field,
                answer_field=data.answer_field,
                references_field=data.references_field,
                images_field=data.images_field,
                limit=data.limit,
                holdout=data.holdout,
                images=check,
            )
        except DataConfigError as error:
            problem = f"data.source: {error}"
        checked[key] = (problem, check, time.perf_counter() - started)
    return checked[key][0]


def image_check_lines(checked: ImageRows) -> list[str]:
    return [
        f"images: {check.images:,} in {check.rows:,} rows of {source!r} found, decoded and within data.max_image_pixels "
        f"({max_pixels:,}) in {seconds:.1f} s"
        for (source, *_, max_pixels), (_, check, seconds) in checked.items()
        if check.images
    ]


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


def preflight(
    configs: dict[str, ExperimentConfig], *, source: str, runs_here: bool = False, echo: Callable[[str], None] | None = None
) -> None:
    """Raise one :class:`ConfigError` listing every problem of every arm (named when not all share it);
    ``echo`` gets a line per image check (how many images, how long)."""
    found: dict[str, list[str]] = {}
    checked: ImageRows = {}
    prompts_checked: dict[str, str | None] = {}
    for arm, config in configs.items():
        problems = arm_problems(config, runs_here=runs_here)
        if not any(problem.startswith("data.source") for problem in problems):  # the rows load once the source checks pass
            problems += [problem] if (problem := image_row_problem(config, checked)) else []
        if not any(problem.startswith(("data.", "model.")) for problem in problems):  # and are formatted once data and model pass
            problems += [problem] if (problem := prompt_problem(config, prompts_checked)) else []
        for problem in problems:
            found.setdefault(problem, []).append(arm)
    if not found:
        for line in image_check_lines(checked) if echo else []:
            echo(line)
        return
    lines = [f"{source}: invalid experiment config"]
    for problem, arms in found.items():
        where = f" (arm {', '.join(map(repr, arms))})" if len(arms) < len(configs) else ""
        lines.append(f"  - {problem}{where}")
    raise ConfigError("\n".join(lines))


def preflight_file(
    path: str | Path,
    *,
    set_options: list[str] | None = None,
    only_arms: list[str] | None = None,
    runs_here: bool = False,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Load an experiment file and run :func:`preflight` on its arms (those in ``only_arms``)."""
    configs = load_experiment(path, set_options=set_options)
    chosen = {arm: config for arm, config in configs.items() if not only_arms or arm in only_arms}
    preflight(chosen or configs, source=str(path), runs_here=runs_here, echo=echo)
    return configs
