"""The learner's side of the rollout inspector (polyrl/tracking/inspector.py): per token of each
sample, what the update saw, captured on the steps that get an inspector page only.

:class:`TokenCapture` holds one update's values as [B, T] tensors on the CPU (NaN: nothing
recorded) and hands them out per row, aligned with each completion's token ids:

- ``learner_logprob``: the learner's log-prob before the update's first optimizer step (π_θ at
  the weights the rollout was trained from; with a recomputed π_old, the same numbers), from one
  no-grad pass over the batch;
- ``entropy``, ``ratio``, ``clipped``: from the training forward of the mini-batch where the row
  trains, in the update's first pass over the batch (``updates_per_batch`` > 1 repeats it; the
  first is kept). ``ratio`` and ``clipped`` are the objective's own (``inspect_tokens``,
  polyrl/algos/objectives/common.py): the ratio it clips (GSPO: the sequence ratio) and the tokens
  whose gradient its clip removes; ``clipped`` is absent for an objective without a clip;
- ``advantage``: the advantage the objective gets (after truncated importance sampling and a
  decoupled correction's weights);
- ``masked``: the tokens a rollout correction took out of the loss (decoupled: in the pipeline;
  bypass: in the micro-batch, against the current π_θ); present only when a correction rejects.

Only the policy's tokens carry values; an episode's observation tokens (off the response mask)
and tokens out of the loss get None (ratio, clipped, entropy, advantage), so the page leaves them
unshaded.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["TokenCapture"]


class TokenCapture:
    def __init__(self, response_mask: Tensor, loss_mask: Tensor, advantages: Tensor, rejected: Tensor | None = None):
        self.response = response_mask.detach().bool().cpu()
        self.loss = loss_mask.detach().bool().cpu()
        shape = self.response.shape
        self.values: dict[str, Tensor] = {
            "learner_logprob": torch.full(shape, math.nan),
            "entropy": torch.full(shape, math.nan),
            "ratio": torch.full(shape, math.nan),
            "advantage": torch.where(self.loss, advantages.detach().float().cpu(), torch.full(shape, math.nan)),
        }
        self.flags: dict[str, Tensor] = {}
        # Decoupled correction: what the pipeline rejected; bypass: filled in by record().
        self.rejected = None if rejected is None else rejected.detach().bool().cpu()
        self.seen = torch.zeros(shape[0], dtype=torch.bool)

    def learner_logprobs(self, start: int, logprobs: Tensor) -> None:
        """The pre-update pass' log-probs of rows ``start`` … ``start + len(logprobs)``."""
        rows, width = logprobs.shape
        self.values["learner_logprob"][start : start + rows, :width] = logprobs.detach().float().cpu()

    def record(self, rows: Tensor, detail: dict[str, Any], *, entropy: Tensor | None, loss_mask: Tensor,
               rejected: Tensor | None = None) -> None:  # fmt: skip
        """One micro-batch's training forward: ``rows`` of the batch, ``detail`` the objective's
        ``tokens/`` tensors (keys without the prefix), ``loss_mask`` the mask the objective got,
        ``rejected`` what a bypass correction removed in it. Rows already recorded keep their values."""
        rows = rows.cpu()
        new = ~self.seen[rows]
        if not new.any():
            return
        rows, pick = rows[new], new.nonzero().squeeze(1)
        self.seen[rows] = True
        trained = loss_mask.detach().bool().cpu()[pick]
        width = trained.shape[1]

        def put(name: str, value: Tensor, where: Tensor) -> None:
            target = self.values[name]
            part = target[rows, :width]
            target[rows, :width] = torch.where(where, value.detach().float().cpu()[pick], part)

        if "ratio" in detail:
            put("ratio", detail["ratio"], trained)
        if entropy is not None:
            put("entropy", entropy, self.response[rows, :width])
        if "clipped" in detail:
            flags = self.flags.setdefault("clipped", torch.zeros(self.response.shape, dtype=torch.bool))
            flags[rows, :width] = detail["clipped"].detach().bool().cpu()[pick] & trained
        if rejected is not None:
            if self.rejected is None:
                self.rejected = torch.zeros(self.response.shape, dtype=torch.bool)
            self.rejected[rows, :width] = rejected.detach().bool().cpu()[pick]

    def rows(self, lengths: list[int]) -> list[dict[str, list[Any]]]:
        """Per row, each quantity as a list of ``lengths[i]`` values (the completion's tokens):
        floats, booleans, or None where the token has none."""
        flags = dict(self.flags)
        if self.rejected is not None:
            flags["masked"] = self.rejected
        out = []
        for i, n in enumerate(lengths):
            n = min(n, self.response.shape[1])
            on = self.response[i, :n].tolist()
            trained = [ok and not math.isnan(r) for ok, r in zip(on, self.values["ratio"][i, :n].tolist())]
            row: dict[str, list[Any]] = {}
            for name, tensor in self.values.items():
                row[name] = [None if not ok or math.isnan(x) else x for ok, x in zip(on, tensor[i, :n].tolist())]
            for name, tensor in flags.items():
                # "clipped" is said of the tokens the objective trained on; "masked" of every policy
                # token (it says why a token left the loss).
                allowed = on if name == "masked" else trained
                row[name] = [bool(x) if ok else None for ok, x in zip(allowed, tensor[i, :n].tolist())]
            out.append(row)
        return out
