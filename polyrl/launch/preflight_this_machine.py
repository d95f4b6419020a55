"""Pre-flight checks of an arm that will run on this machine (``polyrl run``, not ``polyrl
validate``): the learner's device, and the vLLM build against the policy (a state-space model
whose vLLM class needs a compiled kernel this build lacks)."""

from __future__ import annotations

import json
from pathlib import Path

from polyrl.config.schema import ExperimentConfig
from polyrl.runtime.devices import LearnerDeviceError, learner_device

__all__ = ["this_machine_problems", "vllm_kernel_problems"]


def this_machine_problems(config: ExperimentConfig, folder: str | None) -> list[str]:
    """The learner device ``train.device`` names missing here, then :func:`vllm_kernel_problems`;
    ``folder``: the policy's model folder (None for a built-in policy or a ``.gguf`` not yet converted)."""
    problems: list[str] = []
    try:
        learner_device(config.train.device)
    except LearnerDeviceError as error:
        problems.append(str(error))
    return problems + vllm_kernel_problems(config, folder)


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
