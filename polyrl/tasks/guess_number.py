"""The guess-the-number game (environment ``guess_number``): find a hidden integer in a range.

Each row: ``{"prompt", "low", "high", "target", "answer", "id", "split"}``. Ranges 1..10, 1..20,
1..50 and 1..100; split on content: the pair ``(high, target)`` is hashed to a split, so no
held-out game is ever trained on. Binary search solves 1..100 in 7 guesses, so
``env.max_turns`` decides how hard the game is.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from polyrl.tasks.common import SPLITS, ShippedSplits, check_split, hashed_split

__all__ = ["SHIPPED", "SPLITS", "game_split", "make_guess_rows", "read_rows", "shipped_path"]

SHIPPED_SEED = 1234
SHIPPED_SIZES = {"train": 1000, "test": 22}  # the test split has 22 games
DATA_DIR = Path(__file__).parent / "data" / "guess_number"
TEST_BUCKETS = 8
HIGHS = (10, 20, 50, 100)
PROMPT = (
    "I am thinking of a whole number from 1 to {high}. Guess it: answer with one number. "
    'After each guess I say "Higher." or "Lower." until you find it.'
)


def game_split(high: int, target: int) -> str:
    return hashed_split(f"{high}:{target}", TEST_BUCKETS)


def make_guess_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` games of ``split``, deterministic for ``seed``; the 180 games of all ranges are
    drawn without replacement until each of the split's games is used, then again."""
    check_split(split)
    games = [(high, target) for high in HIGHS for target in range(1, high + 1) if game_split(high, target) == split]
    rng = random.Random(f"polyrl-guess-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        order = list(games)
        rng.shuffle(order)
        for high, target in order[: n - len(rows)]:
            rows.append({
                "prompt": PROMPT.format(high=high), "low": 1, "high": high, "target": target, "answer": str(target),
                "id": f"guess-{split}-{len(rows):05d}", "split": split,
            })  # fmt: skip
    return rows


SHIPPED = ShippedSplits(DATA_DIR, SHIPPED_SIZES, SHIPPED_SEED, make_guess_rows)
shipped_path = SHIPPED.path
read_rows = SHIPPED.read

if __name__ == "__main__":
    SHIPPED.regenerate()
