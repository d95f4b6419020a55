"""The one module that asks torch about CUDA, and where the learner's models live (``train.device``).

Every other module asks here (:func:`has_cuda`, :func:`device_count`, :func:`current_cuda_device`,
:func:`auto_device_name`, ...), never ``torch.cuda`` itself, as verl's ``utils/device.py`` is its
code's one door to the accelerator: the CUDA paths are then found in one file, a test can see
what a GPU would change, and another accelerator is one module's change. The GPU-only tests of
these paths are ``tests/gpu`` (``make test-gpu``, the ``gpu`` marker).


``auto`` puts the policy, its reference and its critic on the first CUDA device when torch sees
one, else on the CPU, as TRL (through accelerate) and verl do. An explicit ``cuda`` on a machine
whose torch sees no CUDA device is refused, not run on the CPU: a GPU run silently on the CPU
would be ~100× slower and still look like it worked. Under Ray, a task sees a GPU only when it
asks for one (``polyrl submit --gpus-per-arm``); the device an arm got is logged as
``runtime.learner_device``.

The rollout pipeline (packing, rewards, advantages) stays on the CPU; the learner moves each
learner batch to its device once per update, and the log-probs and values computed for the
pipeline come back to the batch's device. Weight sync hands the engine the policy's own tensors.
"""

from __future__ import annotations

import torch

from polyrl.core.errors import PolyrlError

__all__ = [
    "LearnerDeviceError",
    "auto_device_name",
    "cuda_rng_states",
    "current_cuda_device",
    "device_count",
    "has_cuda",
    "learner_device",
    "resolve_device_name",
    "set_cuda_rng_states",
    "synchronize",
    "use_cuda_device",
]


class LearnerDeviceError(PolyrlError):
    """``train.device`` names a device this machine's torch cannot use."""


def has_cuda() -> bool:
    """Whether this process's torch sees a CUDA device."""
    return torch.cuda.is_available()


def device_count() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if has_cuda() else 0


def current_cuda_device() -> torch.device:
    """This process's current CUDA device (``cuda:N``); only where :func:`has_cuda`."""
    return torch.device("cuda", torch.cuda.current_device())


def use_cuda_device(index: int) -> None:
    """Make CUDA device ``index`` this process's current one."""
    torch.cuda.set_device(index)


def auto_device_name() -> str:
    """``"cuda"`` when torch sees a CUDA device, else ``"cpu"``: where a model without a device
    setting goes (the HF engine, reward models)."""
    return "cuda" if has_cuda() else "cpu"


def resolve_device_name(setting: str) -> str:
    """A module's ``device`` setting: ``"auto"`` is :func:`auto_device_name`, anything else as given."""
    return auto_device_name() if setting == "auto" else setting


def cuda_rng_states() -> list[torch.Tensor]:
    """Every CUDA device's random generator state, in device order ([] without CUDA)."""
    return list(torch.cuda.get_rng_state_all()) if has_cuda() else []


def set_cuda_rng_states(states: list[torch.Tensor]) -> None:
    """Put back :func:`cuda_rng_states` (nothing without CUDA or without states)."""
    if states and has_cuda():
        torch.cuda.set_rng_state_all(states)


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work (a CUDA device's kernels; nothing on the CPU): timings
    of CUDA code read the clock after it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def learner_device(setting: str) -> torch.device:
    """The torch device for ``train.device`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``)."""
    if setting == "auto":
        return current_cuda_device() if has_cuda() else torch.device("cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not has_cuda():
            raise LearnerDeviceError(
                f"train.device: {setting!r}, but this torch sees no CUDA device "
                f"(torch {torch.__version__}); allowed here: 'auto', 'cpu'"
            )
        count = device_count()
        index = device.index if device.index is not None else current_cuda_device().index
        if index >= count:
            raise LearnerDeviceError(
                f"train.device: {setting!r}, but this machine has {count} CUDA device(s); "
                f"allowed here: 'auto', 'cpu', " + ", ".join(f"'cuda:{i}'" for i in range(count))
            )
        return torch.device("cuda", index)
    return device
