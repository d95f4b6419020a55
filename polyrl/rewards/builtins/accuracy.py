"""Answer accuracy (exact or numeric match of an extracted answer) and format checks."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.registry import register_reward

ExtractMode = Literal["auto", "hash", "boxed", "last_number", "full"]
EXTRACT_MODES = ("auto", "hash", "boxed", "last_number", "full")

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_HASH = re.compile(r"####\s*([^\n]*)")


def extract_hash(text: str) -> str | None:
    """The text after the last ``####`` on its line (GSM8K style)."""
    matches = _HASH.findall(text)
    if not matches:
        return None
    value = matches[-1].strip()
    return value or None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for j in range(start, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:j].strip()
    return None


def extract_last_number(text: str) -> str | None:
    """The last number in the text (``1,000``, ``-3.5``, ``.5``)."""
    matches = _NUMBER.findall(text.replace("\u2212", "-"))
    return matches[-1] if matches else None


def extract_answer(text: str, mode: str) -> str | None:
    if mode == "hash":
        return extract_hash(text)
    if mode == "boxed":
        return extract_boxed(text)
    if mode == "last_number":
        return extract_last_number(text)
    if mode == "full":
        return text.strip() or None
    if mode == "auto":
        for extract in (extract_hash, extract_boxed, extract_last_number):
            value = extract(text)
            if value is not None:
                return value
        return None
    raise RewardConfigError(f"unknown extraction mode {mode!r}; allowed: {EXTRACT_MODES}")


def normalize_answer(text: str, *, case_sensitive: bool = False) -> str:
    """Strip whitespace, surrounding ``$``, a trailing period and ``\\text{}``; collapse spaces."""
    text = text.strip().replace("\u2212", "-")
    text = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", text)
    text = text.strip("$ ").rstrip(".").strip()
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


def parse_number(text: str) -> float | None:
    """A float from an answer string: ``1,000``, ``$3.50``, ``50%``, ``3/4``, ``\\frac{3}{4}``."""
    text = normalize_answer(text)
    text = re.sub(r"^\\\$|^\$", "", text).replace("\\$", "").replace("\\%", "%").rstrip("%").strip()
    frac = re.fullmatch(r"(-?)\\d?frac\{([^{}]+)\}\{([^{}]+)\}", text)
    if frac:
        text = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    ratio = re.fullmatch(r"([-+]?\d+(?:\.\d+)?)\s*/\s*([-+]?\d+(?:\.\d+)?)", text)
    try:
        if ratio:
            denominator = float(ratio.group(2))
            return float(ratio.group(1)) / denominator if denominator != 0 else None
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@register_reward("accuracy")
class Accuracy(RewardModule):
    """1.0 when the answer extracted from the completion matches the row's answer, else 0.0.

    The gold answer is the row's ``answer_field`` column, else the sample's first reference;
    a sample with neither is unscored (``None``). A gold answer containing ``####`` (a full
    GSM8K solution) is reduced to the text after it. A completion with no extractable answer
    is incorrect.

    Matching: the normalised strings are equal (whitespace, ``$``, a trailing period and
    ``\\text{}`` removed; case-insensitive unless ``case_sensitive``), or — with ``numeric`` —
    both parse as numbers (``1,000`` = ``1000``, ``3.0`` = ``3``, ``1/2`` = ``0.5``) that agree
    within ``math.isclose(rel_tol=rel_tolerance, abs_tol=abs_tolerance)``.

    Params:
        extract: "auto" (``####`` then ``\\boxed{}`` then last number; default), "hash", "boxed",
            "last_number" or "full" (the whole completion).
        answer_field: the row column holding the answer (default "answer").
        numeric: allow numeric matching (default True).
        abs_tolerance: absolute tolerance of numeric matching (default 1e-6).
        rel_tolerance: relative tolerance of numeric matching (default 0).
        case_sensitive: compare strings case-sensitively (default False).
        correct: reward of a correct answer (default 1.0).
        incorrect: reward of a wrong or missing answer (default 0.0).
    """

    def __init__(
        self,
        extract: ExtractMode = "auto",
        answer_field: str = "answer",
        numeric: bool = True,
        abs_tolerance: float = 1e-6,
        rel_tolerance: float = 0.0,
        case_sensitive: bool = False,
        correct: float = 1.0,
        incorrect: float = 0.0,
    ):
        if extract not in EXTRACT_MODES:
            raise RewardConfigError(f"accuracy: extract must be one of {EXTRACT_MODES}, got {extract!r}")
        if abs_tolerance < 0 or rel_tolerance < 0:
            raise RewardConfigError("accuracy: tolerances must be >= 0")
        self.extract = extract
        self.answer_field = answer_field
        self.numeric = numeric
        self.abs_tolerance = float(abs_tolerance)
        self.rel_tolerance = float(rel_tolerance)
        self.case_sensitive = case_sensitive
        self.correct = float(correct)
        self.incorrect = float(incorrect)

    def gold(self, fields: dict[str, Any], references: list[str]) -> str | None:
        value = fields.get(self.answer_field)
        if value is None:
            value = references[0] if references else None
        if value is None:
            return None
        value = str(value)
        if "####" in value:
            value = extract_hash(value) or ""
        return value

    def matches(self, predicted: str | None, gold: str) -> bool:
        if predicted is None:
            return False
        if normalize_answer(predicted, case_sensitive=self.case_sensitive) == normalize_answer(
            gold, case_sensitive=self.case_sensitive
        ):
            return True
        if self.numeric:
            a, b = parse_number(predicted), parse_number(gold)
            if a is not None and b is not None:
                return math.isclose(a, b, rel_tol=self.rel_tolerance, abs_tol=self.abs_tolerance)
        return False

    def score(self, batch: RewardBatch) -> list[float | None]:
        out: list[float | None] = []
        for completion, fields, refs in zip(batch.completions, batch.fields, batch.references):
            gold = self.gold(fields, refs)
            if gold is None:
                out.append(None)
                continue
            hit = self.matches(extract_answer(completion, self.extract), gold)
            out.append(self.correct if hit else self.incorrect)
        return out


@register_reward("format")
class Format(RewardModule):
    """``matched`` (1.0) when the completion fits a regular expression, else ``unmatched`` (0.0).

    Params:
        pattern: a Python regular expression (required), e.g. ``"<think>.*</think>\\s*<answer>.*</answer>"``.
        match: "fullmatch" (the whole completion must match; default) or "search" (anywhere).
        flags: ``re`` flag names, default ["DOTALL"] so ``.`` spans lines; e.g. ["IGNORECASE"].
        strip: strip surrounding whitespace from the completion first (default True).
        matched: reward when it matches (default 1.0).
        unmatched: reward when it does not (default 0.0).
    """

    def __init__(
        self,
        pattern: str | None = None,
        match: Literal["fullmatch", "search"] = "fullmatch",
        flags: list[str] | None = None,
        strip: bool = True,
        matched: float = 1.0,
        unmatched: float = 0.0,
    ):
        if not pattern:
            raise RewardConfigError("format: params.pattern (a regular expression) is required")
        if match not in ("fullmatch", "search"):
            raise RewardConfigError(f"format: match must be 'fullmatch' or 'search', got {match!r}")
        value = 0
        for flag in ["DOTALL"] if flags is None else flags:
            if not isinstance(getattr(re, str(flag).upper(), None), re.RegexFlag):
                raise RewardConfigError(f"format: unknown regex flag {flag!r}")
            value |= getattr(re, str(flag).upper())
        try:
            self.regex = re.compile(pattern, value)
        except re.error as error:
            raise RewardConfigError(f"format: bad pattern {pattern!r}: {error}") from error
        self.pattern = pattern
        self.match = match
        self.strip = strip
        self.matched = float(matched)
        self.unmatched = float(unmatched)

    def score(self, batch: RewardBatch) -> list[float | None]:
        test = self.regex.fullmatch if self.match == "fullmatch" else self.regex.search
        return [self.matched if test(c.strip() if self.strip else c) else self.unmatched for c in batch.completions]
