"""tests/gpu: the CUDA paths, run on a machine with a GPU (``make test-gpu``: ``pytest -m gpu
tests/gpu``). Every test here carries the ``gpu`` marker and is skipped, before any of its
fixtures start, where torch sees no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run make test-gpu on a machine with one")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
