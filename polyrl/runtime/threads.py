"""torch's CPU thread count, set so that it holds even beside an in-process vLLM engine."""

from __future__ import annotations

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
