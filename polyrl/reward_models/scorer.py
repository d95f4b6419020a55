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
from polyrl.runtime.devices import resolve_device_name


def pair_text(tokenizer: Any, prompt: str, completion: str, *, chat_template: bool = True, separator: str = "\n") -> str:
    """The text a scorer reads for one pair: a user turn and an assistant turn of the tokenizer's
    chat template (when ``chat_template`` and the tokenizer has one), else ``prompt + separator +
    completion``. Shared with the pairwise trainer (pairwise_training.py), so that a scorer is
    trained on the same text it scores."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False
        )
    return prompt + separator + completion


def encode_pair(tokenizer: Any, prompt: str, completion: str, *, chat_template: bool = True, separator: str = "\n") -> list[int]:
    """Token ids of :func:`pair_text`. A rendered chat template already holds its special tokens
    (BOS among them), so the tokenizer adds none then; plain text gets the tokenizer's own."""
    templated = bool(chat_template and getattr(tokenizer, "chat_template", None))
    text = pair_text(tokenizer, prompt, completion, chat_template=chat_template, separator=separator)
    return tokenizer.encode(text, add_special_tokens=not templated)


def padded_batch(rows: list[list[int]], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Right-padded ``(input_ids, attention_mask, pad_id)`` of token-id rows, for a sequence classifier.

    transformers' sequence classifiers score each row at its last token that is not
    ``config.pad_token_id``. With the tokenizer's pad (often EOS) a row that ends in EOS would be
    scored one token early, so the padding uses an id that no row contains; the caller sets the
    model's ``config.pad_token_id`` to the returned id before the forward pass.
    """
    used = {t for row in rows for t in row}
    pad = next(t for t in range(vocab_size - 1, -1, -1) if t not in used)
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, row in enumerate(rows):
        ids[k, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[k, : len(row)] = 1
    return ids, mask, pad


def unreadable_weights(folder: Path) -> str | None:
    """The first safetensors file of ``folder`` whose header does not read (a truncated file),
    with safetensors' error; None when every one reads."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as error:  # noqa: BLE001 - safetensors raises its own SafetensorError (or OSError)
            return f"{str(path)!r} does not read as safetensors ({type(error).__name__}: {error})"
    return None


def refuse_unloaded_weights(folder: Path, model: Any, loading: dict[str, Any]) -> None:
    """Refuse a scorer whose weights transformers did not all find in ``folder`` (``loading``:
    ``from_pretrained``'s ``output_loading_info``). A causal LM folder loads as a sequence
    classifier with a freshly, randomly initialised ``score`` head, and its "scores" would be noise
    that RL then optimises; transformers only logs that, so it is refused here by name."""
    missing = sorted(str(key) for key in loading.get("missing_keys") or ())
    mismatched = sorted(str(item[0] if isinstance(item, tuple) else item) for item in loading.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    shown = ", ".join((missing + mismatched)[:8]) + (" …" if len(missing) + len(mismatched) > 8 else "")
    what = "not in the checkpoint" if not mismatched else "not in the checkpoint or of another shape there"
    architectures = ", ".join(getattr(model.config, "architectures", None) or []) or "no architectures listed"
    raise RewardConfigError(
        f"learned_scorer params.model: {str(folder)!r} has no trained weights for {shown} ({what}; its config.json "
        f"names {architectures}), so transformers initialised them at random and the scores would be noise; point it "
        "at a sequence-classification model whose head was trained (e.g. one saved by "
        "experiments/real/train_arithmetic_scorer.py), not a causal LM"
    )


def refuse_tokens_past_the_embedding(folder: Path, tokenizer: Any, model: Any) -> None:
    """Refuse a scorer whose tokenizer can produce ids its embedding has no row for (an IndexError
    at the first batch holding such a token otherwise)."""
    tokens, rows = len(tokenizer), int(model.get_input_embeddings().num_embeddings)
    if tokens > rows:
        raise RewardConfigError(
            f"learned_scorer params.model: {str(folder)!r}: its tokenizer has {tokens} tokens but the model's input "
            f"embedding only {rows} rows, so ids {rows}..{tokens - 1} would index past it; resize the model's "
            "embedding to the tokenizer (resize_token_embeddings) and save it again, or save the tokenizer it was "
            "trained with"
        )


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
        if not (Path(model).expanduser() / "config.json").is_file():  # at validate, not at the first step
            raise RewardConfigError(
                f"learned_scorer params.model: {model!r} is not a model folder (no config.json there); allowed: a folder "
                "holding a sequence-classification model and its tokenizer (e.g. saved by experiments/real/train_arithmetic_scorer.py)"
            )
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
        device = resolve_device_name(self.device_name)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        try:
            model, loading = AutoModelForSequenceClassification.from_pretrained(
                folder, dtype=getattr(torch, self.dtype), output_loading_info=True
            )
        except Exception as error:
            if (broken := unreadable_weights(folder)) is not None:
                raise RewardConfigError(
                    f"learned_scorer params.model: {broken}; the file is cut short or damaged (an interrupted save or "
                    "copy?): save the scorer again"
                ) from error
            raise
        refuse_unloaded_weights(folder, model, loading)
        refuse_tokens_past_the_embedding(folder, self.tokenizer, model)
        self.model = model.to(device).eval()
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
        return pair_text(self.tokenizer, prompt, completion, chat_template=self.chat_template, separator=self.separator)

    @torch.no_grad()
    def score(self, batch: RewardBatch) -> list[float | None]:
        self.setup()
        rows = [
            encode_pair(self.tokenizer, p, c, chat_template=self.chat_template, separator=self.separator)
            for p, c in zip(batch.prompts, batch.completions)
        ]
        out: list[float | None] = [None] * len(batch)
        kept = [i for i, ids in enumerate(rows) if 0 < len(ids) <= self.max_input_tokens]
        self.stats = {"scored": len(kept), "too_long": len(batch) - len(kept)}
        if len(kept) < len(batch):
            self.stats["shortest_too_long"] = min((len(ids) for ids in rows if len(ids) > self.max_input_tokens), default=0)
        device = next(self.model.parameters()).device
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        for start in range(0, len(kept), self.batch_size):
            chunk = kept[start : start + self.batch_size]
            ids, mask, pad = padded_batch([rows[i] for i in chunk], vocab)
            self.model.config.pad_token_id = pad
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            values = logits[:, 0] if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)[:, self.output]
            for i, value in zip(chunk, values.tolist()):
                out[i] = float(value)
        return out

    def unscored_reason(self) -> str | None:
        """Why the last score call left pairs unscored (longer than ``max_input_tokens``), or None."""
        if not self.stats.get("too_long"):
            return None
        return (
            f"learned_scorer left {self.stats['too_long']} pairs unscored, each longer than params.max_input_tokens "
            f"({self.max_input_tokens}; the shortest was {self.stats.get('shortest_too_long', '?')} tokens): raise it"
        )

    def close(self) -> None:
        self.model = None
