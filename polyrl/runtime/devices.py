"""Where the learner's models live (``train.device``).

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

__all__ = ["LearnerDeviceError", "learner_device"]


class LearnerDeviceError(PolyrlError):
    """``train.device`` names a device this machine's torch cannot use."""


def learner_device(setting: str) -> torch.device:
    """The torch device for ``train.device`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``)."""
    if setting == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LearnerDeviceError(
                f"train.device: {setting!r}, but this torch sees no CUDA device "
                f"(torch {torch.__version__}); allowed here: 'auto', 'cpu'"
            )
        count = torch.cuda.device_count()
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= count:
            raise LearnerDeviceError(
                f"train.device: {setting!r}, but this machine has {count} CUDA device(s); "
                f"allowed here: 'auto', 'cpu', " + ", ".join(f"'cuda:{i}'" for i in range(count))
            )
        return torch.device("cuda", index)
    return device
