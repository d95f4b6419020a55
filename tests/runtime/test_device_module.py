"""polyrl/runtime/devices.py is the one module that asks torch about CUDA: its answers on this
machine, and a scan of the package that fails when another module calls ``torch.cuda`` itself.
The CUDA side of these functions runs in tests/gpu (``make test-gpu``) on a machine with a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import polyrl
from polyrl.runtime import devices

without_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answers of a machine without CUDA")


def test_every_cuda_question_is_asked_in_the_device_module():
    package = Path(polyrl.__file__).parent
    pattern = re.compile(r"torch\.cuda\b|cuda\.is_available")
    askers = sorted(
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path.name != "devices.py" and pattern.search(path.read_text(encoding="utf-8"))
    )
    assert askers == [], f"ask polyrl.runtime.devices instead of torch.cuda in: {askers}"


@without_cuda
def test_without_cuda_everything_goes_to_the_cpu():
    assert devices.has_cuda() is False and devices.device_count() == 0
    assert devices.auto_device_name() == "cpu" and devices.resolve_device_name("auto") == "cpu"
    assert devices.cuda_rng_states() == []
    devices.set_cuda_rng_states([])  # nothing to put back: no error
    devices.synchronize("cpu")  # nothing queued on the CPU: returns


def test_an_explicit_device_setting_is_kept_as_given():
    assert devices.resolve_device_name("cpu") == "cpu"
    assert devices.resolve_device_name("cuda:1") == "cuda:1"  # refused later, where it is used, if absent
