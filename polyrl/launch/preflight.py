"""What ``polyrl validate`` and the start of ``polyrl run`` check without training: the
orchestration, one message listing every problem of every arm.

Each arm's reward modules are loaded and constructed (not set up: heavy resources load in
``setup``), the model folder and the first row of the data are looked at, so a broken reward
file, a folder without a tokenizer or a data file without the prompt field is one message in a
second — before any MLflow run is created or any model loads. Like verl's and TRL's config
checks, only what is cheap is checked here; dataset names (the Hub) are left to the loader.

The checks themselves, by what they look at: :mod:`polyrl.launch.preflight_rewards` (the reward
modules), :mod:`polyrl.launch.preflight_chat` (chat templates and an environment's rendering),
:mod:`polyrl.launch.preflight_images` (image data, padding-free rows, every image decoded),
:mod:`polyrl.launch.preflight_prompts` (every training prompt formatted and held to the sampler's
rule) and :mod:`polyrl.launch.preflight_this_machine` (an arm that runs here: its device and the
vLLM build).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import VLM_TASKS, ConfigError, ExperimentConfig, load_experiment
from polyrl.data.image_rows import model_takes_images
from polyrl.data.prompts import DataConfigError, check_prompt_source
from polyrl.launch.preflight_chat import chat_problems, env_problems
from polyrl.launch.preflight_images import ImageRows, image_check_lines, image_problems, image_row_problem, padding_free_problems
from polyrl.launch.preflight_prompts import prompt_problem
from polyrl.launch.preflight_rewards import accuracy_problems, reward_labels, reward_problems
from polyrl.launch.preflight_this_machine import this_machine_problems
from polyrl.policies.paths import check_model_dir
from polyrl.policies.pretrained import is_gguf_path, packaged_gguf


def _reads_images(config: ExperimentConfig, folder: str | None) -> bool:
    """The policy is an image-text model: a built-in image task's, or a folder whose config has a vision side."""
    if folder is None:
        return config.model.path is None and config.model.builtin.name is None and config.model.builtin.task in VLM_TASKS
    return model_takes_images(folder)  # a missing or broken folder: False here, check_model_dir names it


def arm_problems(config: ExperimentConfig, *, runs_here: bool = False) -> list[str]:
    """``runs_here``: the arm will run on this machine (``polyrl run``), so its devices are checked
    too, and the vLLM build against the policy
    (:func:`~polyrl.launch.preflight_this_machine.this_machine_problems`)."""
    # A .gguf model.path becomes a folder only when the run converts it, as a built-in policy is built.
    folder = config.model.path if not is_gguf_path(config.model.path) else None
    problems = reward_problems(list(config.rewards), model_path=folder, image_text_policy=_reads_images(config, folder))
    if runs_here:
        problems += this_machine_problems(config, folder)
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
