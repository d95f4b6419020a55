"""``learned_scorer``: a sequence-classification model folder as a reward module.

A Bradley–Terry reward model (one output: its logit is the reward, "Training language models
to follow instructions with human feedback", Ouyang et al., arXiv 2203.02155, §3.5) or a
classifier (several outputs: the probability of the class named by ``label``). Loaded with
transformers' ``AutoModelForSequenceClassification`` once in ``setup``, on the learner's device
(CUDA when there is one), and run over the batch in chunks of ``batch_size``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.registry import register_reward


@register_reward("learned_scorer")
class LearnedScorer(RewardModule):
    """A sequence-classification model scores each (prompt, completion) pair.

    Parameters:
        model: a Hugging Face folder holding an ``AutoModelForSequenceClassification`` model and its tokenizer.
        label: for a model with several outputs, the class whose probability is the score (its
            index or its name in the config's ``id2label``); must be left out for a one-output model,
            whose logit is the score.
        chat_template: format the pair as a user and an assistant turn with the tokenizer's chat
            template (when it has one), as reward models trained on chats expect; else
            ``prompt + separator + completion``.
        separator: put between prompt and completion without a chat template.
        batch_size: pairs per forward pass.
        max_input_tokens: a longer pair is unscored (never cut).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        device: ``auto`` (CUDA when available, as the learner), ``cpu`` or ``cuda``.
    """

    def __init__(
        self,
        model: str,
        label: int | str | None = None,
        chat_template: bool = True,
        separator: str = "\n",
        batch_size: int = 16,
        max_input_tokens: int = 2048,
        dtype: str = "float32",
        device: str = "auto",
    ):
        if not isinstance(model, str) or not model.strip():
            raise RewardConfigError("learned_scorer params.model: a sequence-classification model folder")
        for name, value in (("batch_size", batch_size), ("max_input_tokens", max_input_tokens)):
            if not isinstance(value, int) or value < 1:
                raise RewardConfigError(f"learned_scorer params.{name}: a positive integer, got {value!r}")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise RewardConfigError(f"learned_scorer params.dtype: {dtype!r}; allowed: float32, bfloat16, float16")
        if device not in ("auto", "cpu", "cuda"):
            raise RewardConfigError(f"learned_scorer params.device: {device!r}; allowed: auto, cpu, cuda")
        self.model_path, self.label, self.chat_template, self.separator = model, label, chat_template, separator
        self.batch_size, self.max_input_tokens, self.dtype, self.device_name = batch_size, max_input_tokens, dtype, device
        self.model: Any = None
        self.tokenizer: Any = None
        self.output = 0
        self.stats: dict[str, int] = {}

    def setup(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(self.model_path).expanduser()
        if not (folder / "config.json").is_file():
            raise RewardConfigError(f"learned_scorer params.model: {str(folder)!r} is not a model folder (no config.json)")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if self.device_name == "auto" else self.device_name
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = (
            AutoModelForSequenceClassification.from_pretrained(folder, dtype=getattr(torch, self.dtype)).to(device).eval()
        )
        config = self.model.config
        outputs = int(config.num_labels)
        if outputs == 1:
            if self.label is not None:
                raise RewardConfigError(
                    f"learned_scorer params.label: {self.label!r} given, but the model has one output (its logit is the score); remove it"
                )
            return
        names = {str(v): int(k) for k, v in (config.id2label or {}).items()}
        if self.label is None:
            raise RewardConfigError(
                f"learned_scorer params.label: the model has {outputs} outputs; name the class whose probability is the score "
                f"(an index 0..{outputs - 1} or one of {sorted(names)})"
            )
        if isinstance(self.label, int) and 0 <= self.label < outputs:
            self.output = self.label
        elif str(self.label) in names:
            self.output = names[str(self.label)]
        else:
            raise RewardConfigError(
                f"learned_scorer params.label: {self.label!r} is not a class of the model; allowed: 0..{outputs - 1} or {sorted(names)}"
            )

    def text(self, prompt: str, completion: str) -> str:
        if self.chat_template and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False
            )
        return prompt + self.separator + completion

    @torch.no_grad()
    def score(self, batch: RewardBatch) -> list[float | None]:
        self.setup()
        templated = bool(self.chat_template and getattr(self.tokenizer, "chat_template", None))
        rows = [
            self.tokenizer.encode(self.text(p, c), add_special_tokens=not templated)
            for p, c in zip(batch.prompts, batch.completions)
        ]
        out: list[float | None] = [None] * len(batch)
        kept = [i for i, ids in enumerate(rows) if 0 < len(ids) <= self.max_input_tokens]
        self.stats = {"scored": len(kept), "too_long": len(batch) - len(kept)}
        device = next(self.model.parameters()).device
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        for start in range(0, len(kept), self.batch_size):
            chunk = kept[start : start + self.batch_size]
            width = max(len(rows[i]) for i in chunk)
            # transformers' sequence classifiers score each row at its last token that is not the pad
            # id. With the tokenizer's pad (often EOS) a row that ends in EOS would be scored one token
            # early, so the padding uses an id that no row of the chunk contains.
            used = {t for i in chunk for t in rows[i]}
            pad = next(t for t in range(vocab - 1, -1, -1) if t not in used)
            self.model.config.pad_token_id = pad
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for k, i in enumerate(chunk):
                ids[k, : len(rows[i])] = torch.tensor(rows[i])
                mask[k, : len(rows[i])] = 1
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            values = logits[:, 0] if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)[:, self.output]
            for i, value in zip(chunk, values.tolist()):
                out[i] = float(value)
        return out

    def close(self) -> None:
        self.model = None
