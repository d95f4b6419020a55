"""Fluency: perplexity of the completion under a frozen scoring language model."""

from __future__ import annotations

import math
from typing import Any

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.registry import register_reward
from polyrl.runtime.devices import resolve_device_name


@register_reward("ppl_fluency")
class PerplexityFluency(RewardModule):
    """Penalise completions whose perplexity under a frozen LM exceeds ``tau``.

    ppl = exp(mean negative log-likelihood of the completion tokens given the prompt), and the
    reward is ``min(0, (tau - ppl) / scale)``: 0 for ppl ≤ tau, −1 per ``scale`` of perplexity
    above it.

    The composite reward this term belongs to is polyrl's own design. Its first draft wrote
    ``min(0, (ppl − 50)/10)``: that expression is negative only when ppl < 50, i.e. it punishes
    *fluent* text and never punishes disfluent text, the opposite of its stated purpose. We use
    the sign that penalises high perplexity.

    The model is loaded in ``setup`` (``AutoModelForCausalLM`` from a local directory), kept in
    eval mode without gradients, and run on right-padded micro-batches. The prompt is
    tokenised with the tokenizer's special tokens and the completion without; when the prompt
    is empty the BOS token (if any) gives the first completion token a context, otherwise the
    first completion token is not scored. A completion with no scored token is unscored
    (``None``). Prompts are cut from the left to fit ``max_length``.

    Params:
        model_path: local Hugging Face model directory of the scoring LM (default in training:
            the policy's starting model, declared by ``policy_path_param``); in training also the
            name of a built-in pretrained model (``smollm2-135m-instruct``), resolved to its cached
            folder. An image-text policy cannot be the default: name a text model.
        tau: perplexity above which the penalty starts (default 50).
        scale: perplexity per unit of penalty (default 10).
        batch_size: sequences per forward pass (default 16).
        max_length: longest sequence fed to the model (default: the model's
            ``max_position_embeddings``, else 1024).
        device: "cpu", "cuda", "cuda:1", ... or "auto" (cuda when available; default "auto").
        dtype: "float32" (default), "bfloat16" or "float16".
    """

    # Without params.model_path, training scores with the policy's starting model.
    policy_path_param = "model_path"

    def __init__(
        self,
        model_path: str | None = None,
        tau: float = 50.0,
        scale: float = 10.0,
        batch_size: int = 16,
        max_length: int | None = None,
        device: str = "auto",
        dtype: str = "float32",
    ):
        if scale <= 0:
            raise RewardConfigError(f"ppl_fluency: scale must be > 0, got {scale}")
        if batch_size < 1:
            raise RewardConfigError(f"ppl_fluency: batch_size must be >= 1, got {batch_size}")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise RewardConfigError(f"ppl_fluency: dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.model_path = model_path
        self.tau = float(tau)
        self.scale = float(scale)
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.dtype = dtype
        self.model: Any = None
        self.tokenizer: Any = None

    def setup(self) -> None:
        if self.model is not None:
            return
        if not self.model_path:
            raise RewardConfigError("ppl_fluency needs params.model_path: a local Hugging Face model directory")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device_name(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        import transformers

        major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
        dtype_key = "dtype" if major_minor >= (4, 56) else "torch_dtype"  # renamed in transformers 4.56
        model = AutoModelForCausalLM.from_pretrained(self.model_path, **{dtype_key: getattr(torch, self.dtype)})
        model.eval().requires_grad_(False)
        self.model = model.to(device)
        if self.max_length is None:
            self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 1024)

    def _encode(self, prompt: str, completion: str) -> tuple[list[int], int]:
        """Token ids of prompt+completion and the index of the first completion token."""
        tok = self.tokenizer
        prompt_ids = list(tok(prompt, add_special_tokens=True)["input_ids"]) if prompt else []
        completion_ids = list(tok(completion, add_special_tokens=False)["input_ids"])
        if not prompt_ids and tok.bos_token_id is not None:
            prompt_ids = [tok.bos_token_id]
        completion_ids = completion_ids[: self.max_length]
        keep = self.max_length - len(completion_ids)
        prompt_ids = prompt_ids[len(prompt_ids) - keep :] if keep > 0 else []
        return prompt_ids + completion_ids, len(prompt_ids)

    def perplexities(self, batch: RewardBatch) -> list[float | None]:
        """Per-sample perplexity of the completion given the prompt (``None``: nothing to score)."""
        import torch

        if self.model is None:
            self.setup()
        encoded = [self._encode(p, c) for p, c in zip(batch.prompts, batch.completions)]
        out: list[float | None] = [None] * len(encoded)
        # Longest first so padding within a micro-batch is small.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]))
        order = [i for i in order if len(encoded[i][0]) - max(encoded[i][1], 1) > 0]
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            width = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            # scored[b, t] = 1 where token t+1 is a completion token predicted from position t.
            scored = torch.zeros((len(chunk), width - 1), dtype=torch.bool)
            for row, i in enumerate(chunk):
                seq, first = encoded[i]
                ids[row, : len(seq)] = torch.tensor(seq)
                attention[row, : len(seq)] = 1
                scored[row, max(first, 1) - 1 : len(seq) - 1] = True
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
            logits = logits[:, :-1].float()
            targets = ids[:, 1:].to(device)
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            scored = scored.to(device)
            mean_nll = (nll * scored).sum(1) / scored.sum(1)
            for row, i in enumerate(chunk):
                out[i] = math.exp(float(mean_nll[row]))
        return out

    def reward_from_perplexity(self, ppl: float) -> float:
        return min(0.0, (self.tau - ppl) / self.scale)

    def score(self, batch: RewardBatch) -> list[float | None]:
        return [None if p is None else self.reward_from_perplexity(p) for p in self.perplexities(batch)]
