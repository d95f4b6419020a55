"""The critic: a value model, its own optimizer and its cadence in policy optimizer steps.

Its inputs and outputs are plain data: packed batches in, values and metrics out. The learner
calls :meth:`Critic.after_policy_step` after each applied policy step; the critic decides from
its cadence whether it updates (a delayed critic: polyrl's own schedule, ``train.value.update_every``). The value model has the
policy's architecture (:func:`build_value_model`): an image-text policy's critic sees the images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForImageTextToText, AutoModelForTokenClassification

from polyrl.algos.aggregation import loss_normalizer_count
from polyrl.algos.losses import clipped_value_loss
from polyrl.engines.image_prompts import model_takes_images
from polyrl.learner.lr_schedule import apply_optimizer_settings
from polyrl.learner.nonfinite import NonFiniteGuard, guarded_step
from polyrl.modeling.batches import PackedBatch
from polyrl.modeling.logprobs import image_forward_inputs
from polyrl.rollout.batches import LearnerBatch
from polyrl.runtime.data_parallel import LocalGroup
from polyrl.runtime.precision import autocast

__all__ = ["Critic", "CriticSettings", "ImageTextValueModel", "ValueModel", "build_value_model"]


class ValueModel(torch.nn.Module):
    """A text policy's critic: its backbone with a scalar head (transformers' token-classification
    head, as verl's critic)."""

    def __init__(self, path: str | Path, dtype: torch.dtype):
        super().__init__()
        self.model = AutoModelForTokenClassification.from_pretrained(str(path), num_labels=1, dtype=dtype)

    def forward(self, batch: PackedBatch) -> Tensor:
        device = next(self.parameters()).device
        batch = batch.to(device)
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[..., 0]  # [B, S]
        return _response_values(logits[..., None], batch)


class ImageTextValueModel(torch.nn.Module):
    """A critic with the image-text policy's architecture: its multimodal base model (vision tower,
    connector, text decoder; the LM head dropped) and a scalar linear value head.

    Peers build critics the same way: verl and OpenRLHF put a linear value head on the policy's
    backbone (verl loads image-text critics as the full VLM wrapped in TRL's
    ``AutoModelForCausalLMWithValueHead``), TRL's value head is ``Linear(hidden, 1)`` on the last
    hidden state. A text-only backbone would give V(s_t) that cannot see the image the answer is
    about, so every image prompt would share one baseline.
    """

    def __init__(self, path: str | Path, dtype: torch.dtype):
        super().__init__()
        full = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype)
        base = getattr(full, "base_model", None)
        if base is None or base is full:
            raise ValueError(f"{path}: {type(full).__name__} has no separate multimodal base model to put a value head on")
        self.backbone = base
        hidden = full.config.get_text_config().hidden_size
        # OpenRLHF's critic head (init_value_head): no bias, weights ~ N(0, 1/(hidden+1)), so the
        # first values are near 0 (about ±0.1 on the tiny VLM) beside returns of order 1.
        self.value_head = torch.nn.Linear(hidden, 1, bias=False, dtype=dtype)
        torch.nn.init.normal_(self.value_head.weight, mean=0.0, std=1.0 / (hidden + 1))

    def forward(self, batch: PackedBatch) -> Tensor:
        device = next(self.parameters()).device
        batch = batch.to(device)
        # The learner's collation: a text-only row in a mixed batch gets all-zero images, which
        # Idefics3 drops, so it is valued as when run alone.
        hidden = self.backbone(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            use_cache=False,
            **image_forward_inputs(self.backbone, batch),
        ).last_hidden_state
        return _response_values(hidden, batch, head=self.value_head)


def _response_values(states: Tensor, batch: PackedBatch, head: torch.nn.Module | None = None) -> Tensor:
    """``[B, T]`` values from per-position ``states [B, S, H]``: read where the policy's logits for
    completion token t are read (``response_index``), through ``head`` if given (else ``H == 1``),
    0 off the response."""
    picked = torch.gather(states, 1, batch.response_index[..., None].expand(-1, -1, states.shape[-1]))  # [B, T, H]
    values = (head(picked) if head is not None else picked)[..., 0].float()
    return torch.where(batch.response_mask.bool(), values, torch.zeros_like(values))


def build_value_model(path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The critic for the policy at ``path``: image-text policies get :class:`ImageTextValueModel`,
    text policies :class:`ValueModel`."""
    return ImageTextValueModel(path, dtype) if model_takes_images(path) else ValueModel(path, dtype)


@dataclass(frozen=True)
class CriticSettings:
    learning_rate: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    clip_range: float | None = 0.2
    max_grad_norm: float = 1.0
    update_every: int = 1  # in policy optimizer steps
    micro_batch_size: int = 8
    max_consecutive_nonfinite: int = 3
    compute_dtype: torch.dtype = torch.float32


class Critic:
    def __init__(self, model: torch.nn.Module, settings: CriticSettings, group: Any | None = None):
        # ``group``: data-parallel ranks (train.learner_workers) train the critic on their shards
        # too, with the same global normaliser, summed gradients and global clip norm as the policy.
        self.group = group if group is not None else LocalGroup()
        # Dropout off, as for the policy: V_old and V_θ are the same function of the weights.
        self.model = model.eval()
        self.settings = settings
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=settings.learning_rate, betas=settings.betas, weight_decay=settings.weight_decay
        )
        self.guard = NonFiniteGuard(settings.max_consecutive_nonfinite, prefix="critic_")

    def apply_optimizer_settings(self) -> None:
        """The settings' hyper-parameters, also over those a checkpoint restored."""
        s = self.settings
        apply_optimizer_settings(self.optimizer, lr=s.learning_rate, betas=s.betas, weight_decay=s.weight_decay)

    @torch.no_grad()
    def values(self, packed: PackedBatch) -> Tensor:
        size = self.settings.micro_batch_size
        with autocast(self.model, self.settings.compute_dtype):
            return torch.cat([self.model(packed.select(slice(i, i + size))) for i in range(0, len(packed), size)])

    def after_policy_step(
        self, batch: LearnerBatch, rows: Tensor, optimizer_step: int, skipped: dict[str, int]
    ) -> dict[str, float] | None:
        """Update on ``rows`` if policy optimizer step ``optimizer_step`` (1-based) is on the cadence."""
        if (optimizer_step - 1) % self.settings.update_every != 0:
            return None
        return self.update(batch, rows, skipped)

    def update(self, batch: LearnerBatch, rows: Tensor, skipped: dict[str, int]) -> dict[str, float]:
        s = self.settings
        shard = self.group.shard(rows, batch.packed.attention_mask.sum(dim=1))
        normalizer = max(self.group.sum(loss_normalizer_count(batch.loss_mask[shard], mode="token_mean")), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in torch.split(shard, s.micro_batch_size) if len(shard) else ():
            with autocast(self.model, s.compute_dtype):
                values = self.model(batch.packed.select(micro))
            loss, _ = clipped_value_loss(
                values,
                batch.old_values[micro],
                batch.returns[micro],
                batch.loss_mask[micro],
                clip_range=s.clip_range,
                loss_normalizer=normalizer,
                aggregation="token_mean",
            )
            loss.backward()
            total += float(loss.detach())
        self.group.reduce_gradients(self.model.parameters())
        total = self.group.sum(total)
        grad_norm = self.group.clip_grad_norm(self.model.parameters(), s.max_grad_norm)
        guarded_step(self.optimizer, self.guard, total, grad_norm, skipped)
        return {"value/loss": total, "value/grad_norm": grad_norm}
