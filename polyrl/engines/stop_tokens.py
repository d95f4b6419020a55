"""Where generation stops: EOS, the model's generation-config EOS ids, and the end of a chat turn.

A chat model ends its answer with the template's end-of-turn token (``<|im_end|>`` in ChatML,
``<end_of_turn>`` in Gemma, ``<|eot_id|>`` in Llama 3, ``<|end|>`` in Phi-3), which is often
*not* the tokenizer's EOS (Qwen2.5 base: EOS ``<|endoftext|>``; Llama 3 base: EOS
``<|end_of_text|>``). An engine that stops at EOS alone runs past the end of the answer into a
new turn it invents. Both engines stop at every id of :func:`stop_token_ids`, keep the stop
token as the completion's last token and report its sampling log-prob, so the learner scores
it like every other completion token (the policy learns when to stop); the completion *text*
leaves it out (rewards never see template tokens).

The end-of-turn token is read off the template itself, not from a list of known names:
:func:`end_of_turn_id` renders a one-exchange conversation whose assistant turn is a marker
string and takes the first added (special) token the template writes after the marker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The assistant's text in the probe conversation: plain ASCII no template rewrites.
_MARKER = "polyrl end-of-turn probe 7f3a"


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The token the tokenizer's chat template writes right after an assistant message, or
    ``None`` (no template, a template that fails on the probe, or plain text after the turn)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _MARKER}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # noqa: BLE001 - a template may reject the probe (jinja raises its own errors)
        return None
    if not isinstance(text, str) or _MARKER not in text:
        return None
    after = text[text.rindex(_MARKER) + len(_MARKER) :]
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(getattr(tokenizer, "all_special_ids", []) or [])
    for token in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if int(token) in added:
            return int(token)
    return None


def generation_config_eos(model_path: str | Path) -> list[int]:
    """The ``eos_token_id`` of the model folder's ``generation_config.json`` (an int or a list), or []."""
    path = Path(model_path) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, list) else []


def stop_token_ids(tokenizer: Any, generation_eos: list[int] | tuple[int, ...] = ()) -> frozenset[int]:
    """Every id that ends a completion: the tokenizer's EOS, the generation config's EOS ids and
    the chat template's end-of-turn token."""
    ids = {int(i) for i in generation_eos}
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    turn_end = end_of_turn_id(tokenizer)
    if turn_end is not None:
        ids.add(turn_end)
    return frozenset(ids)


def completion_text(
    tokenizer: Any,
    token_ids: list[int],
    finish_reason: str,
    stops: frozenset[int] | set[int],
    stop_strings: list[str] | tuple[str, ...] = (),
) -> str:
    """The text rewards see, by one rule in both engines: the ids decoded without special tokens
    and without the final stop token (EOS or end of turn, a template token even where the
    tokenizer does not mark it special), cut before the first stop string."""
    if finish_reason == "stop" and token_ids and token_ids[-1] in stops:
        token_ids = token_ids[:-1]
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stop_strings if s in text]
    return text[: min(cuts)] if cuts else text
