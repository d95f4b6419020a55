"""The drawing reward: a drawn grid of palette tokens scored cell by cell, plus the text after it.

A drawing answer is ``<img>`` + one palette token per cell (row-major) + ``</img>``, optionally
followed by a caption::

    <img><blue><blue><red><blue><blue><blue><blue><blue><blue></img> a red dot at top right on blue

The vocabulary (palette tokens, image markers) lives here, in the lowest layer that needs it,
so the task generator, the tokenizer builder and the modality marking share one definition.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule, RewardModuleError
from polyrl.rewards.registry import register_reward

PALETTE_COLOURS = ("black", "white", "red", "green", "blue", "yellow", "cyan", "magenta")
IMAGE_OPEN = "<img>"
IMAGE_CLOSE = "</img>"


def palette_token(colour: str) -> str:
    return f"<{colour}>"


PALETTE_TOKENS = tuple(palette_token(colour) for colour in PALETTE_COLOURS)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ParsedDrawing:
    """A parsed answer: the grid's cells (palette tokens, row-major) and the text after it.

    ``cells`` is ``None`` when the grid is malformed; ``reason`` then says why.
    """

    cells: tuple[str, ...] | None
    text: str
    reason: str | None = None


def parse_drawing(
    text: str, *, palette: Sequence[str] = PALETTE_TOKENS, open_marker: str = IMAGE_OPEN, close_marker: str = IMAGE_CLOSE
) -> ParsedDrawing:
    """Split ``text`` into its grid cells and the text after the grid.

    Well-formed: optional whitespace, exactly one ``open_marker`` ... ``close_marker`` pair
    with nothing but palette tokens between them, then any text. Anything else gives
    ``cells=None`` and a ``reason``; ``text`` is then what follows the last close marker (or
    ``""``).
    """
    stripped = text.lstrip()
    close_at = stripped.rfind(close_marker)
    after = stripped[close_at + len(close_marker) :].strip() if close_at >= 0 else ""
    if not stripped.startswith(open_marker):
        return ParsedDrawing(None, after, f"does not start with {open_marker}")
    if close_at < 0:
        return ParsedDrawing(None, after, f"no {close_marker}")
    if stripped.count(open_marker) != 1 or stripped.count(close_marker) != 1:
        return ParsedDrawing(
            None,
            after,
            f"{stripped.count(open_marker)} {open_marker} and {stripped.count(close_marker)} {close_marker} (one pair expected)",
        )
    body = stripped[len(open_marker) : close_at]
    cells: list[str] = []
    position = 0
    # Longest match first, so a palette token that is a prefix of another cannot shadow it.
    ordered = sorted(palette, key=len, reverse=True)
    while position < len(body):
        token = next((t for t in ordered if body.startswith(t, position)), None)
        if token is None:
            return ParsedDrawing(None, after, f"cell {len(cells)}: {body[position : position + 12]!r} is not a palette token")
        cells.append(token)
        position += len(token)
    return ParsedDrawing(tuple(cells), after)


def caption_f1(predicted: str, reference: str) -> float:
    """Bag-of-words F1 (lower-cased alphanumeric words, counted with multiplicity).

    Both empty -> 1.0 (nothing was asked, nothing was written); one empty -> 0.0.
    """
    pred, ref = _WORD.findall(predicted.lower()), _WORD.findall(reference.lower())
    if not pred and not ref:
        return 1.0
    if not pred or not ref:
        return 0.0
    overlap = sum((Counter(pred) & Counter(ref)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class DrawingScore:
    score: float | None
    grid: float | None  # share of correct cells (0.0 when malformed, None when unscored)
    text: float | None  # caption F1 (reported; it does not count when the grid is malformed)
    reason: str | None  # why the grid scored 0 (malformed), or why the sample is unscored


@register_reward("drawing")
class Drawing(RewardModule):
    """Scores a drawn grid per cell and the text after it against the sample's reference answer.

    ``score = (1 - text_weight) * grid + text_weight * text`` where

    - ``grid`` is the share of the reference's cells the completion got right (same position,
      same palette token).
    - ``text`` is the bag-of-words F1 between the text after ``</img>`` in the completion and in
      the reference. When the prompt asked for no caption the reference text is empty: an
      empty completion text scores 1, any extra words 0.

    A malformed completion grid (no leading ``<img>``, no ``</img>``, more than one pair, a
    non-palette token inside, or a cell count other than the reference's) scores 0 in all —
    a wrong answer, not an unscorable one, so RL still learns the format (an unclosed grid
    followed by nothing must not earn the "no caption asked" text credit); :meth:`details`
    gives the reason.

    The reference is the best-scoring of the sample's references (each a full answer). A
    sample with no reference is unscored (``None``); a reference that is not itself a
    well-formed drawing is a data error (:class:`RewardModuleError` naming the sample).

    Params:
        text_weight: weight of the caption/text part in [0, 1] (default 0.2).
        palette: palette token strings (default the eight ``<colour>`` tokens).
        open_marker / close_marker: image markers (default ``<img>`` / ``</img>``).
    """

    def __init__(
        self,
        text_weight: float = 0.2,
        palette: list[str] | None = None,
        open_marker: str = IMAGE_OPEN,
        close_marker: str = IMAGE_CLOSE,
    ) -> None:
        if not 0.0 <= text_weight <= 1.0:
            raise RewardConfigError(f"drawing: text_weight must be in [0, 1], got {text_weight}")
        palette = list(PALETTE_TOKENS if palette is None else palette)
        if not palette or any(not isinstance(t, str) or not t for t in palette):
            raise RewardConfigError(f"drawing: palette must be a non-empty list of non-empty strings, got {palette!r}")
        if not open_marker or not close_marker or open_marker == close_marker:
            raise RewardConfigError(
                f"drawing: open_marker and close_marker must be two different non-empty strings, got {open_marker!r}, {close_marker!r}"
            )
        self.text_weight = float(text_weight)
        self.palette = tuple(palette)
        self.open_marker, self.close_marker = open_marker, close_marker

    def parse(self, text: str) -> ParsedDrawing:
        return parse_drawing(text, palette=self.palette, open_marker=self.open_marker, close_marker=self.close_marker)

    def _score_one(self, completion: str, reference: str, batch: RewardBatch, index: int) -> DrawingScore:
        target = self.parse(reference)
        if target.cells is None:
            raise RewardModuleError(
                f"drawing: the reference of {batch.sample(index)} is not a drawing: {target.reason}", index=index
            )
        drawn = self.parse(completion)
        text = caption_f1(drawn.text, target.text)
        if drawn.cells is None or len(drawn.cells) != len(target.cells):
            reason = drawn.reason or f"grid has {len(drawn.cells)} cells, expected {len(target.cells)}"
            return DrawingScore(0.0, 0.0, text, reason)
        grid = sum(a == b for a, b in zip(drawn.cells, target.cells)) / len(target.cells)
        return DrawingScore((1 - self.text_weight) * grid + self.text_weight * text, grid, text, None)

    def details(self, batch: RewardBatch) -> list[DrawingScore]:
        """Per sample: the score, its grid and text parts, and why a grid scored 0 (or why unscored)."""
        out = []
        for i, (completion, references) in enumerate(zip(batch.completions, batch.references)):
            if not references:
                out.append(DrawingScore(None, None, None, "no reference answer"))
                continue
            scored = [self._score_one(completion, ref, batch, i) for ref in references]
            out.append(max(scored, key=lambda s: s.score))
        return out

    def score(self, batch: RewardBatch) -> list[float | None]:
        return [d.score for d in self.details(batch)]
