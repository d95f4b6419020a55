"""Training prompts the policy cannot take are refused before training, naming the rows.

A prompt of 10,065 tokens given to a model of 512 positions used to train with exit 0 and only a
library warning in the log: the engine cut or mangled it, and every score of that row was of a
prompt the model never saw. The rule, stated once here: a prompt must leave at least one of the
policy's positions for its response, so a prompt of ``limit`` tokens or more is refused, where
``limit`` is ``rollout.max_model_len`` or the model's own positions (``max_position_embeddings``
in its config.json), whichever is smaller. Refusing up front (rather than truncating or dropping
rows by a setting) keeps the data a run trains on the data its YAML names; the message lists the
rows so they can be shortened or removed.

Lengths are counted as the engines send a prompt: a chat prompt's own ids, else the text
encoded without added special tokens (as :func:`polyrl.engines.kv_cache.prompt_lengths`).
Image prompts are not counted here (the engine expands each image into the model's own number
of positions).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyrl.core.types import PromptSample
from polyrl.data.chat import ChatFormat, format_prompts
from polyrl.data.errors import DataConfigError

# The config.json keys that hold a model's positions, by the families that use them.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
SHOWN_ROWS = 5


def model_positions(model_dir: str | Path | None) -> int | None:
    """The positions a model folder's config.json declares (its text config's, for an image-text
    model); None when it declares none or cannot be read."""
    if model_dir is None:
        return None
    try:
        config = json.loads(Path(model_dir, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config.get("text_config") or {}, config):
        for key in POSITION_KEYS:
            value = section.get(key) if isinstance(section, dict) else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def prompt_token_limit(max_model_len: int, model_dir: str | Path | None, *, positions: int | None = None) -> tuple[int, str]:
    """The prompt length (in tokens) at which a prompt is refused, and where that bound comes from;
    ``positions`` stands for the model's own when there is no folder to read them from."""
    positions = model_positions(model_dir) if positions is None else positions
    if positions is not None and positions < max_model_len:
        return (
            positions,
            f"the model's {positions:,} positions (max_position_embeddings; rollout.max_model_len is {max_model_len:,})",
        )
    return max_model_len, f"rollout.max_model_len {max_model_len:,}"


def check_prompt_lengths(samples: Sequence[PromptSample], tokenizer: Any, *, limit: int, bound: str, source: str) -> None:
    """Refuse when any text prompt of ``samples`` has ``limit`` tokens or more (see the module doc)."""
    texts = [(index, s.prompt) for index, s in enumerate(samples) if s.prompt_ids is None and not s.images]
    lengths = {index: len(s.prompt_ids) for index, s in enumerate(samples) if s.prompt_ids is not None and not s.images}
    if texts:
        encoded = tokenizer([text for _, text in texts], add_special_tokens=False)["input_ids"]
        lengths.update({index: len(ids) for (index, _), ids in zip(texts, encoded)})
    over = sorted(index for index, length in lengths.items() if length >= limit)
    if not over:
        return
    shown = ", ".join(f"row {index} has {lengths[index]:,}" for index in over[:SHOWN_ROWS])
    more = f" (and {len(over) - SHOWN_ROWS:,} more)" if len(over) > SHOWN_ROWS else ""
    raise DataConfigError(
        f"data.source {source!r}: {len(over):,} of {len(samples):,} prompts leave no position for a response: {shown} "
        f"tokens{more}; a prompt must be shorter than {limit:,} tokens ({bound}). Shorten or remove those rows, or "
        "raise rollout.max_model_len where the model has the positions"
    )


def checked_training_prompts(
    rows: Sequence[PromptSample],
    tokenizer: Any,
    fmt: ChatFormat,
    *,
    max_model_len: int,
    model_dir: str | Path | None,
    source: str,
    model: str,
    positions: int | None = None,
) -> list[PromptSample]:
    """The training prompts exactly as the sampler holds them (chat formatted with the policy's
    tokenizer, :func:`polyrl.data.chat.format_prompts`), refused when one leaves no position for a
    response. The one rule both the sampler (``trainer/build_data.py``) and the pre-flight check of
    ``polyrl validate`` / ``polyrl run`` (``launch/preflight_prompts.py``) apply, so they refuse alike."""
    samples = format_prompts(rows, tokenizer, fmt, model=model)
    limit, bound = prompt_token_limit(max_model_len, model_dir, positions=positions)
    check_prompt_lengths(samples, tokenizer, limit=limit, bound=bound, source=source)
    return samples
