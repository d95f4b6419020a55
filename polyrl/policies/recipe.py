"""One warm-up recipe for the three built-in families (the arithmetic text policy, the drawing
policy, the image-text policy): the settings that define a build, hashed into the name of its
cache folder, and the supervised loop they share.

RL needs a policy that is *sometimes* right, so each family starts from a short supervised run
on its shipped task. A family states its :class:`WarmupRecipe` and two functions: ``train()``
builds and trains its model, ``finish(folder, model, state)`` evaluates it on held-out rows and
saves it. :meth:`WarmupRecipe.build` returns the cached folder when one is complete, else runs
them once into a temporary folder published under the key (:mod:`polyrl.policies.cache`), with
the build record (the settings, the key, the size, the timings and the family's fields) beside
the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polyrl.policies.cache import build_cached, build_record, cache_key, is_complete, resolve_cache_dir
from polyrl.runtime.threads import torch_threads

__all__ = ["WarmupRecipe", "lr_at", "supervised_steps"]

# The order of the settings in the build record (the key hashes them sorted, so order is cosmetic).
_SETTINGS = (
    "task",
    "size",
    "seed",
    "steps",
    "lr",
    "batch_size",
    "warmup_steps",
    "eval_prompts",
    "max_new_tokens",
    "data_version",
    "model_fingerprint",
    "code_version",
)


@dataclass(frozen=True)
class WarmupRecipe:
    """Every input that changes a family's warmed-up policy; its cache key hashes them all.

    ``warmup_steps`` and ``max_new_tokens`` are part of the key only for the families that
    record them (None: not recorded), so the keys of existing caches stay what they were.
    """

    prefix: str  # the key's first word: "arith", "draw", "vlm"
    task: str
    size: str
    seed: int
    steps: int
    lr: float
    batch_size: int
    eval_prompts: int
    data_version: str  # a hash of the shipped rows the build trains and evaluates on
    model_fingerprint: str  # a hash of the untrained model's definition (size entry, vocabulary, builder code)
    code_version: str  # bumped by the family when its warm-up code changes the result
    warmup_steps: int | None = None
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")

    def settings(self) -> dict[str, Any]:
        """The recipe as the key and the build record see it."""
        return {name: getattr(self, name) for name in _SETTINGS if getattr(self, name) is not None}

    def key(self) -> str:
        return cache_key(self.prefix, self.settings())

    def build(
        self,
        cache_dir: str | Path | None,
        train: Callable[[], tuple[torch.nn.Module, Any]],
        finish: Callable[[Path, torch.nn.Module, Any], dict[str, Any]],
        *,
        num_threads: int | None = 1,
        force: bool = False,
    ) -> Path:
        """The folder of this recipe's policy under ``cache_dir`` (default: ``$POLYRL_CACHE``,
        else ``~/.cache/polyrl/models``): the cached one when complete (unless ``force``), else
        built now. ``train()`` returns the trained model and what ``finish`` needs of the run;
        ``finish`` evaluates and saves the model into the folder and returns the record's fields.
        ``num_threads`` caps torch's CPU threads during the build (restored afterwards; None
        leaves them): on matrices this small, intra-op threads cost more in synchronisation
        than they save."""
        final = resolve_cache_dir(cache_dir) / self.key()
        if not force and is_complete(final):
            return final

        def write(folder: Path) -> dict[str, Any]:
            started = time.perf_counter()
            model, state = train()
            train_seconds = time.perf_counter() - started
            fields = finish(folder, model, state)
            params = sum(parameter.numel() for parameter in model.parameters())
            record = build_record(self.settings(), key=final.name, params=params, started=started, train_seconds=train_seconds)
            return {**record, **fields}

        with torch_threads(num_threads):
            return build_cached(final, write, force=force)


def lr_at(step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
    """Linear warm-up then cosine decay to ``min_lr_ratio * lr`` (1.0, the default: constant).

    A constant rate after warm-up makes a build of ``n`` steps exactly the first ``n`` steps of
    a longer build, so the step count can be tuned from one learning curve. With no warm-up
    steps and ``min_lr_ratio`` 1.0 it is ``lr`` at every step, exactly.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def supervised_steps(
    model: torch.nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    *,
    steps: int,
    lr: float,
    warmup_steps: int = 0,
    min_lr_ratio: float = 1.0,
    weight_decay: float = 0.01,
    on_step: Callable[[int, float, torch.nn.Module], None] | None = None,
) -> list[float]:
    """``steps`` AdamW steps (betas 0.9/0.98, gradient norm clipped at 1.0) on the next batch of
    ``batches`` each, whose entries are the model's keyword arguments with ``labels`` (-100
    where no loss is taken); :func:`lr_at` sets the rate. ``on_step(step, loss, model)`` runs
    after every update. Leaves the model in eval mode; returns every step's loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        batch = next(batches)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps=steps, lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1], model)
            model.train()
    model.eval()
    return losses
