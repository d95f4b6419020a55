"""Which modality each *generated* token belongs to, from a rule the model directory declares.

A policy that draws (``polyrl.tasks.drawing``) writes pictures as palette tokens between image
markers. Those tokens are image content and take the image GAE setting (per-modality GAE γ/λ
is polyrl's own design, ``modalities`` in the experiment YAML);
everything else it generates is text. The rule belongs to the tokenizer — only it knows which
ids are palette tokens — so it is stored beside the tokenizer, in ``polyrl_modalities.json``::

    {"image": {"open": "<img>", "close": "</img>", "tokens": ["<black>", "<white>", ...]}}

Both rollout engines read it when they load a model directory and fill
``Completion.completion_token_modalities`` with it: a token is ``"image"`` when it is one of
``tokens`` and lies strictly between an ``open`` and the next ``close`` marker; the markers
and everything else are ``"text"``. A model directory without the file generates text only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.core.errors import PolyrlError

MODALITY_FILE = "polyrl_modalities.json"
# One letter per modality in the compact strings of sample tables ("TTIIIIIIIIITT").
MODALITY_LETTERS = {"text": "T", "image": "I"}


class ModalityRuleError(PolyrlError, ValueError):
    """A model directory's modality rule that cannot be used (names the file and field)."""


@dataclass(frozen=True)
class ImageSpanRule:
    """Image tokens are ``image_ids`` strictly between ``open_id`` and the next ``close_id``."""

    open_id: int
    close_id: int
    image_ids: frozenset[int]

    def modalities(self, token_ids: Iterable[int]) -> tuple[str, ...]:
        inside = False
        out = []
        for token in token_ids:
            if token == self.open_id:
                inside = True
                out.append("text")
            elif token == self.close_id:
                inside = False
                out.append("text")
            else:
                out.append("image" if inside and token in self.image_ids else "text")
        return tuple(out)


def token_modalities(rule: ImageSpanRule | None, token_ids: Sequence[int]) -> tuple[str, ...]:
    """Each token's modality under ``rule`` (all ``"text"`` without one)."""
    return rule.modalities(token_ids) if rule is not None else ("text",) * len(token_ids)


def modality_string(modalities: Iterable[str]) -> str:
    """One letter per token (``T`` text, ``I`` image, else the name's first letter upper-cased)."""
    return "".join(MODALITY_LETTERS.get(m, m[:1].upper() or "?") for m in modalities)


def _single_token_id(tokenizer: Any, token: str, where: str) -> int:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ModalityRuleError(
            f"{where}: {token!r} is {len(ids)} tokens in this tokenizer, not one (it must be a single vocabulary token)"
        )
    return int(ids[0])


def rule_from_tokens(
    tokenizer: Any, open_marker: str, close_marker: str, image_tokens: Sequence[str], *, where: str = "modality rule"
) -> ImageSpanRule:
    """An :class:`ImageSpanRule` from token strings; each must be a single token of ``tokenizer``."""
    if not image_tokens:
        raise ModalityRuleError(f"{where}: image.tokens is empty; list the tokens that are image content")
    open_id = _single_token_id(tokenizer, open_marker, f"{where}: image.open")
    close_id = _single_token_id(tokenizer, close_marker, f"{where}: image.close")
    if open_id == close_id:
        raise ModalityRuleError(f"{where}: image.open and image.close are the same token {open_marker!r}")
    image_ids = frozenset(_single_token_id(tokenizer, t, f"{where}: image.tokens") for t in image_tokens)
    if {open_id, close_id} & image_ids:
        raise ModalityRuleError(f"{where}: image.tokens must not contain the markers")
    return ImageSpanRule(open_id, close_id, image_ids)


def write_modality_rule(directory: str | Path, *, open_marker: str, close_marker: str, image_tokens: Sequence[str]) -> Path:
    """Write ``polyrl_modalities.json`` into a model directory."""
    path = Path(directory) / MODALITY_FILE
    payload = {"image": {"open": open_marker, "close": close_marker, "tokens": list(image_tokens)}}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def load_modality_rule(directory: str | Path, tokenizer: Any) -> ImageSpanRule | None:
    """The rule a model directory declares, ``None`` when it declares none (text only)."""
    path = Path(directory) / MODALITY_FILE
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModalityRuleError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(payload, dict) or set(payload) != {"image"} or not isinstance(payload["image"], dict):
        raise ModalityRuleError(f"{path}: expected one key 'image' holding {{open, close, tokens}}, got {payload!r:.200}")
    image = payload["image"]
    missing = {"open", "close", "tokens"} - set(image)
    extra = set(image) - {"open", "close", "tokens"}
    if missing or extra:
        raise ModalityRuleError(
            f"{path}: image needs exactly open, close and tokens (missing {sorted(missing)}, unknown {sorted(extra)})"
        )
    if not isinstance(image["open"], str) or not isinstance(image["close"], str):
        raise ModalityRuleError(f"{path}: image.open and image.close must be strings")
    if not isinstance(image["tokens"], list) or not all(isinstance(t, str) for t in image["tokens"]):
        raise ModalityRuleError(f"{path}: image.tokens must be a list of strings")
    return rule_from_tokens(tokenizer, image["open"], image["close"], image["tokens"], where=str(path))
