"""torch's CPU thread count, set so that it holds even beside an in-process vLLM engine."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch


def set_torch_threads(count: int) -> int:
    """Set torch's intra-op thread count and check it took.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a function that only logs a
    warning once it has bound its threads, so in a process with an in-process vLLM engine
    ``train.threads`` would be ignored without a word. ``torch._C.set_num_threads`` is the
    setter itself, which vLLM leaves alone.
    """
    torch._C.set_num_threads(count)
    if torch.get_num_threads() != count:
        raise RuntimeError(f"torch kept {torch.get_num_threads()} threads when asked for {count}")
    return count


def default_torch_threads() -> int:
    """The learner's thread count when ``train.threads`` is unset: ``OMP_NUM_THREADS`` when the
    environment sets it to a positive integer (the convention torch itself follows at start-up,
    and how a user or a scheduler shares a machine between processes), else every core.

    Set explicitly because vLLM drops torch to one thread once its engine is up, so the default
    torch chose at start-up is gone by the time the learner runs."""
    requested = os.environ.get("OMP_NUM_THREADS", "").strip()
    if requested.isdigit() and int(requested) > 0:
        return int(requested)
    return os.cpu_count() or 1


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Cap torch's CPU threads inside the block (``None``: leave them), restored after."""
    previous = torch.get_num_threads()
    if count is not None:
        set_torch_threads(count)
    try:
        yield
    finally:
        set_torch_threads(previous)
