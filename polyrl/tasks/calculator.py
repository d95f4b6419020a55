"""The calculator task: multiply a three-digit by a two-digit number (environment ``calculator``).

Each row: ``{"prompt", "a", "b", "answer", "references", "id", "split"}``. Split on content: the
pair ``(a, b)`` is hashed to a split, so no held-out pair is ever trained on (a train and a test
row never share ``(a, b)``; the same ``a`` may appear with another ``b``). The prompt asks for
the product and mentions the calculator tool; the environment (polyrl/envs/builtins/calculator.py)
offers the tool and scores the final answer.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from polyrl.tasks.common import SPLITS, ShippedSplits, check_split, hashed_split

__all__ = ["SHIPPED", "SPLITS", "make_calculator_rows", "pair_split", "read_rows", "shipped_path"]

SHIPPED_SEED = 1234
SHIPPED_SIZES = {"train": 2000, "test": 200}
DATA_DIR = Path(__file__).parent / "data" / "calculator"
TEST_BUCKETS = 8  # one pair in 8 is held out
PROMPT = "What is {a} * {b}? You may use the calculator tool. End with the final answer as a number."


def pair_split(a: int, b: int) -> str:
    return hashed_split(f"{a}*{b}", TEST_BUCKETS)


def make_calculator_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` distinct pairs ``100 <= a <= 999``, ``10 <= b <= 99`` of ``split``, deterministic for ``seed``."""
    check_split(split)
    rng = random.Random(f"polyrl-calculator-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    while len(rows) < n:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if (a, b) in seen or pair_split(a, b) != split:
            continue
        seen.add((a, b))
        rows.append({
            "prompt": PROMPT.format(a=a, b=b), "a": a, "b": b, "answer": str(a * b), "references": [str(a * b)],
            "id": f"calc-{split}-{len(rows):05d}", "split": split,
        })  # fmt: skip
    return rows


SHIPPED = ShippedSplits(DATA_DIR, SHIPPED_SIZES, SHIPPED_SEED, make_calculator_rows)
shipped_path = SHIPPED.path
read_rows = SHIPPED.read

if __name__ == "__main__":
    SHIPPED.regenerate()
