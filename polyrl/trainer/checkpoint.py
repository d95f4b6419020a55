"""Checkpoints: everything a killed run needs to continue as if it had never stopped.

A checkpoint folder holds the policy (and critic) weights as safetensors, optimizer state as
safetensors plus a JSON of its scalar hyper-parameters, the RNG states, the data position and
the MLflow run ids. No pickle is written or read: tensors go through safetensors, the rest
through JSON. Folders are written under a temporary name (``step_N.partial``) and renamed, so
a kill mid-write never leaves a checkpoint that looks complete; a ``.partial`` folder is never
read as a checkpoint (even one killed after its marker was written) and is removed by the next
writer. A write that fails (disk full) removes its partial folder and raises
:class:`CheckpointWriteError` naming the checkpoint; the earlier checkpoints stay untouched.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from polyrl.core.errors import PolyrlError
from polyrl.modeling.lora import LoraError, LoraPolicy, load_adapter, merged_model, write_adapter
from polyrl.runtime.devices import cuda_rng_states, has_cuda, set_cuda_rng_states

COMPLETE_MARKER = "checkpoint.json"
ADAPTER_SUFFIX = "_adapter"  # a model.lora run's policy: policy_adapter/ (a PEFT adapter folder) instead of policy.safetensors
PARTIAL_SUFFIX = ".partial"
# Only ``step_<digits>`` is a checkpoint; ``step_000003.partial`` (a write cut short) is not.
CHECKPOINT_NAME = re.compile(r"^step_(\d+)$")


class CheckpointWriteError(PolyrlError):
    """A checkpoint could not be written (e.g. the disk is full); the run cannot continue safely."""

    resumable = True  # the runner adds how to resume once the cause is fixed


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint folder name (``step_000004`` → 4); None for anything else."""
    match = CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    try:
        save_file(tensors, str(path))
    except SafetensorError as error:
        # safetensors reports I/O failures as text ("... (os error 28)"); recover the errno so
        # a full disk reads as one in the error the user sees.
        found = re.search(r"os error (\d+)", str(error))
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from error


def _optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for index, entry in state["state"].items():
        scalars["state"][str(index)] = {}
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().clone().contiguous()
            else:
                scalars["state"][str(index)][key] = value
    return tensors, scalars


def _optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for index, entry in scalars["state"].items():
        state[int(index)] = dict(entry)
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    numpy_state = np.random.get_state()
    tensors = {"torch_cpu": torch.get_rng_state()}
    scalars = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [numpy_state[0], numpy_state[1].tolist(), int(numpy_state[2]), int(numpy_state[3]), float(numpy_state[4])],
    }
    for index, cuda_state in enumerate(cuda_rng_states()):
        tensors[f"torch_cuda_{index}"] = cuda_state
    return tensors, scalars


def restore_rng_state(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    version, internal, gauss = scalars["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = scalars["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    if has_cuda():
        set_cuda_rng_states([tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))])


def save_checkpoint(
    directory: str | Path,
    *,
    step: int,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
) -> Path:
    """Write ``directory`` atomically; ``state`` is any JSON-serialisable bookkeeping.

    Raises :class:`CheckpointWriteError` when the write fails; nothing of it is left behind.
    """
    directory = Path(directory)
    staging = directory.with_name(directory.name + PARTIAL_SUFFIX)
    try:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        _write_checkpoint_files(staging, step=step, models=models, optimizers=optimizers, state=state)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        previous = latest_checkpoint(directory.parent)
        kept = f"the latest complete checkpoint, {previous.name}, is kept" if previous else "there is no earlier checkpoint"
        raise CheckpointWriteError(
            f"could not write checkpoint {directory.name} to {directory.parent}: {error.strerror or error}"
            f"{' (the disk is full)' if error.errno in (errno.ENOSPC, errno.EDQUOT) else ''}; "
            f"its partial folder was removed and {kept}"
        ) from None
    return directory


def _write_checkpoint_files(
    staging: Path,
    *,
    step: int,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
) -> None:
    for name, model in models.items():
        if isinstance(model, LoraPolicy):
            # The adapter only, as a PEFT adapter folder; the base weights are the run's policy_path.
            write_adapter(model, staging / f"{name}{ADAPTER_SUFFIX}", save_tensors=_save_tensors)
            continue
        weights = {key: value.detach().contiguous().clone() for key, value in model.state_dict().items()}
        # Tied weights share storage; safetensors refuses shared tensors, clone() above splits them.
        _save_tensors(weights, staging / f"{name}.safetensors")
    for name, optimizer in optimizers.items():
        tensors, scalars = _optimizer_to_flat(optimizer)
        _save_tensors(tensors, staging / f"{name}_optimizer.safetensors")
        (staging / f"{name}_optimizer.json").write_text(json.dumps(scalars))
    rng_tensors, rng_scalars = rng_state()
    _save_tensors(rng_tensors, staging / "rng.safetensors")
    (staging / "rng.json").write_text(json.dumps(rng_scalars))
    # The marker is written last: a folder without it is never complete.
    (staging / COMPLETE_MARKER).write_text(json.dumps({"step": step, **state}, indent=2))


def load_checkpoint(
    directory: str | Path,
    *,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
) -> dict[str, Any]:
    """Restore weights, optimizer and RNG state in place; return the JSON bookkeeping."""
    directory = Path(directory)
    for name, model in models.items():
        if isinstance(model, LoraPolicy):
            adapter = directory / f"{name}{ADAPTER_SUFFIX}"
            if not adapter.is_dir():
                raise LoraError(f"checkpoint {directory} has no {adapter.name}/: it was not written by a model.lora run")
            load_adapter(model, adapter)
            continue
        if (directory / f"{name}{ADAPTER_SUFFIX}").is_dir():
            raise LoraError(f"checkpoint {directory} holds a LoRA adapter ({name}{ADAPTER_SUFFIX}/), but model.lora is not set")
        weights = load_file(str(directory / f"{name}.safetensors"))
        model.load_state_dict(weights, strict=True)
    for name, optimizer in optimizers.items():
        tensors = load_file(str(directory / f"{name}_optimizer.safetensors"))
        scalars = json.loads((directory / f"{name}_optimizer.json").read_text())
        _optimizer_from_flat(optimizer, tensors, scalars)
    restore_rng_state(load_file(str(directory / "rng.safetensors")), json.loads((directory / "rng.json").read_text()))
    return json.loads((directory / COMPLETE_MARKER).read_text())


def checkpoint_dirs(arm_dir: str | Path) -> list[Path]:
    """Complete checkpoints of an arm, oldest first (``.partial`` folders are never among them)."""
    arm_dir = Path(arm_dir)
    if not arm_dir.is_dir():
        return []
    found = [p for p in arm_dir.iterdir() if checkpoint_step(p) is not None and p.is_dir() and (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=checkpoint_step)


def read_checkpoint_info(checkpoint: str | Path) -> dict[str, Any]:
    """The JSON bookkeeping of a complete checkpoint (step, MLflow run ids, config, ...)."""
    return json.loads((Path(checkpoint) / COMPLETE_MARKER).read_text())


def remove_partial_checkpoints(arm_dir: str | Path) -> list[Path]:
    """Delete the ``step_*.partial`` folders a killed writer left behind; call only from the
    process that writes this arm's checkpoints (it holds the experiment's lock)."""
    arm_dir = Path(arm_dir)
    if not arm_dir.is_dir():
        return []
    removed = [p for p in arm_dir.glob(f"step_*{PARTIAL_SUFFIX}") if p.is_dir()]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def latest_checkpoint(arm_dir: str | Path) -> Path | None:
    found = checkpoint_dirs(arm_dir)
    return found[-1] if found else None


def prune_checkpoints(arm_dir: str | Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; drop older ones and leftover partials."""
    for old in checkpoint_dirs(arm_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    remove_partial_checkpoints(arm_dir)


def export_model_dir(checkpoint: str | Path, out_dir: str | Path, *, base_model_path: str | Path | None = None) -> Path:
    """Turn a checkpoint's policy into a Hugging Face model folder (config, tokenizer,
    ``model.safetensors``) that vLLM, transformers and ``polyrl eval`` load directly.

    The config and tokenizer come from the base model the run started from (recorded in the
    checkpoint as ``policy_path``) unless ``base_model_path`` is given. A LoRA checkpoint
    (``policy_adapter/``) is the base model with its adapter folded into the weights.
    """
    checkpoint = Path(checkpoint)
    info = json.loads((checkpoint / COMPLETE_MARKER).read_text())
    base = Path(base_model_path or info["policy_path"])
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint}: its base model folder {base} is gone (no config.json)")
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for item in base.iterdir():
        if item.is_file() and not item.name.endswith((".safetensors", ".bin")) and item.name != "model.safetensors.index.json":
            shutil.copy2(item, staging / item.name)
    adapter = checkpoint / f"policy{ADAPTER_SUFFIX}"
    if adapter.is_dir():
        from polyrl.engines.image_prompts import auto_model_class

        merged = merged_model(auto_model_class(base).from_pretrained(str(base), dtype=torch.float32), adapter)
        merged.save_pretrained(str(staging))  # config.json as the base's, model.safetensors merged (tied weights once)
    else:
        shutil.copy2(checkpoint / "policy.safetensors", staging / "model.safetensors")
    (staging / "polyrl_checkpoint.json").write_text(
        json.dumps(
            {
                "checkpoint": str(checkpoint.resolve()),
                "step": info["step"],
                "mlflow_run_id": info.get("mlflow_run_id"),
                "lora": adapter.is_dir(),
            }
        )
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return out_dir
