"""A toy any-to-any task: the policy *draws* a small picture in palette tokens, then may caption it.

Prompt and answer (a 3×3 grid, row-major; every cell is one palette token)::

    draw a red dot at top right on blue:
    <img><blue><blue><red><blue><blue><blue><blue><blue><blue></img>

    draw a green column at left on white and caption it:
    <img><green><white><white><green><white><white><green><white><white></img> a green column at left on white

Every cell must be the prompt's foreground or background colour, so the share of correct
cells — the ``drawing`` reward — is graded: a grid in a colour the prompt does not name scores
0, the background alone scores the background's share (8/9 for a dot, 4/9 for a cross), and
only the right shape scores 1. Held-out per-cell accuracy therefore starts well above 0 and
the shape is what is left to learn.

Shapes: ``dot`` at any of 9 cells (``top|middle|bottom`` × ``left|center|right``), ``row`` at
``top|middle|bottom``, ``column`` at ``left|center|right``, 2×2 ``square`` at the four corners,
``cross`` and ``frame`` (no position): 21 geometries × 8·7 (foreground, background) colour
pairs × with/without caption = 2,352 distinct prompts. A prompt's split is a hash of its
geometry and colours (not of the caption request), so held-out prompts are new combinations
of colour and geometry, each of which the train split teaches separately.

The shipped files ``polyrl/tasks/data/drawing/{train,test}.jsonl`` are exactly
``make_drawing_rows(SHIPPED_SIZES[split], seed=SHIPPED_SEED, split=split)``; regenerate them
with ``python -m polyrl.tasks.drawing``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.rewards.builtins.drawing import IMAGE_CLOSE, IMAGE_OPEN, PALETTE_COLOURS, PALETTE_TOKENS, palette_token
from polyrl.tasks.common import SPLITS, ShippedSplits, check_split, hashed_split

SHIPPED_SEED = 1234
SHIPPED_SIZES = {"train": 1200, "test": 200}
DATA_DIR = Path(__file__).parent / "data" / "drawing"
GRID_SIZE = 3
# Share of rows whose prompt asks for a caption after the picture.
CAPTION_FRACTION = 0.5
# One in TEST_BUCKETS of all (geometry, colours) combinations belongs to the test split.
TEST_BUCKETS = 8

ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "center", "right")
CORNERS = ("top left", "top right", "bottom left", "bottom right")

__all__ = [
    "GRID_SIZE",
    "IMAGE_CLOSE",
    "IMAGE_OPEN",
    "PALETTE_COLOURS",
    "PALETTE_TOKENS",
    "SPLITS",
    "Geometry",
    "all_geometries",
    "format_answer",
    "format_prompt",
    "make_drawing_rows",
    "problem_split",
    "render",
    "SHIPPED",
    "read_rows",
    "shipped_path",
]


@dataclass(frozen=True)
class Geometry:
    """A shape and where it is: ``cells`` are the (row, column) cells it covers."""

    shape: str
    position: str  # "" for shapes without a position (cross, frame)
    cells: frozenset[tuple[int, int]]

    @property
    def description(self) -> str:
        return f"{self.shape} at {self.position}" if self.position else self.shape


def all_geometries() -> list[Geometry]:
    """The 21 geometries, in a fixed order."""
    n = GRID_SIZE
    out = [Geometry("dot", f"{ROWS[r]} {COLUMNS[c]}", frozenset({(r, c)})) for r in range(n) for c in range(n)]
    out += [Geometry("row", ROWS[r], frozenset((r, c) for c in range(n))) for r in range(n)]
    out += [Geometry("column", COLUMNS[c], frozenset((r, c) for r in range(n))) for c in range(n)]
    for name in CORNERS:
        top = 0 if name.startswith("top") else n - 2
        left = 0 if name.endswith("left") else n - 2
        out.append(Geometry("square", name, frozenset((top + dr, left + dc) for dr in (0, 1) for dc in (0, 1))))
    middle = n // 2
    out.append(Geometry("cross", "", frozenset({(middle, c) for c in range(n)} | {(r, middle) for r in range(n)})))
    out.append(Geometry("frame", "", frozenset((r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1))))
    return out


def render(geometry: Geometry, foreground: str, background: str) -> list[str]:
    """The grid's colours, row-major."""
    return [foreground if (r, c) in geometry.cells else background for r in range(GRID_SIZE) for c in range(GRID_SIZE)]


def format_prompt(geometry: Geometry, foreground: str, background: str, *, caption: bool) -> str:
    ask = " and caption it" if caption else ""
    return f"draw a {foreground} {geometry.description} on {background}{ask}:"


def format_caption(geometry: Geometry, foreground: str, background: str) -> str:
    return f"a {foreground} {geometry.description} on {background}"


def format_answer(colours: list[str], caption: str = "") -> str:
    """``<img>`` + one palette token per cell + ``</img>`` (+ a space and the caption)."""
    grid = IMAGE_OPEN + "".join(palette_token(c) for c in colours) + IMAGE_CLOSE
    return f"{grid} {caption}" if caption else grid


def problem_split(geometry: Geometry, foreground: str, background: str) -> str:
    """The split of a (geometry, colours) combination, fixed by a hash (seed-independent)."""
    key = f"{geometry.description}|{foreground}|{background}"
    return hashed_split(key, TEST_BUCKETS)


def _combinations(split: str) -> list[tuple[Geometry, str, str]]:
    return [
        (geometry, fg, bg)
        for geometry in all_geometries()
        for fg in PALETTE_COLOURS
        for bg in PALETTE_COLOURS
        if fg != bg and problem_split(geometry, fg, bg) == split
    ]


def make_drawing_rows(n: int, *, seed: int, split: str, caption_fraction: float = CAPTION_FRACTION) -> list[dict[str, Any]]:
    """``n`` distinct prompts of ``split``, deterministic for ``seed``.

    Each row: ``{"prompt", "answer", "references": [answer], "grid", "caption", "shape",
    "position", "foreground", "background", "id", "split"}``; ``grid`` holds the cells'
    colour names, ``caption`` is ``""`` when none was asked.
    """
    check_split(split)
    if not 0.0 <= caption_fraction <= 1.0:
        raise ValueError(f"caption_fraction must be in [0, 1], got {caption_fraction}")
    rng = random.Random(f"polyrl-drawing-{seed}-{split}")
    combos = _combinations(split)
    rng.shuffle(combos)
    # Each combination once with its caption request drawn, then (if n asks for more) the
    # same combinations with the other request: prompts stay distinct.
    first = [(combo, rng.random() < caption_fraction) for combo in combos]
    candidates = first + [(combo, not caption) for combo, caption in first]
    if n > len(candidates):
        raise ValueError(f"the {split} split has {len(candidates)} distinct prompts; asked for {n}")
    rows = []
    for index, ((geometry, fg, bg), caption) in enumerate(candidates[:n]):
        colours = render(geometry, fg, bg)
        text = format_caption(geometry, fg, bg) if caption else ""
        answer = format_answer(colours, text)
        rows.append(
            {
                "prompt": format_prompt(geometry, fg, bg, caption=caption),
                "answer": answer,
                "references": [answer],
                "grid": colours,
                "caption": text,
                "shape": geometry.shape,
                "position": geometry.position,
                "foreground": fg,
                "background": bg,
                "id": f"draw-{split}-{index:05d}",
                "split": split,
            }
        )
    return rows


SHIPPED = ShippedSplits(DATA_DIR, SHIPPED_SIZES, SHIPPED_SEED, make_drawing_rows)
shipped_path = SHIPPED.path
read_rows = SHIPPED.read

if __name__ == "__main__":
    SHIPPED.regenerate()
