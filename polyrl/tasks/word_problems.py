"""One- and two-step arithmetic word problems in chat form, for pretrained chat models.

A row is one user question, answered in free-form text whose last number is checked::

    Mia has 14 marbles. She buys 9 more, then gives 6 to a friend. How many marbles does Mia
    have now? Solve it step by step, then give the final answer as "Answer: <number>".

    (a worked answer: "14 + 9 = 23. 23 - 6 = 17. Answer: 17")

Unlike ``arithmetic_chat`` ("Answer with the number only"), the answer's length is the model's
own choice: it may reason in a line or in a paragraph, so the response-length claims of GRPO vs
Dr.GRPO (Liu et al., arXiv 2503.20783 §3) have something to act on. The accuracy reward's
``auto`` extraction reads ``####``, then ``\\boxed{}``, then the last number of the answer.

Seven problem kinds (``KINDS``): two of one step, buy (a + b) and give away (a − b), 60% of
the rows drawn (about 55% of the shipped rows, as repeated one-step skeletons are redrawn); five of two operations on three numbers, buy-then-give (a + b − c), give-then-find
(a − b + c), bags (a × b − c), two additions (a + b + c) and "more than" (a + (a + b)). A problem's *skeleton* is its kind and its three numbers; names and
objects are surface. The split is a hash of the skeleton, so no test problem shares its
computation with any train problem (the same sum with another name is not a new problem).

The shipped files ``polyrl/tasks/data/word_problems/{train,test}.jsonl`` are exactly
``make_word_problem_rows(SHIPPED_SIZES[split], seed=SHIPPED_SEED, split=split)``; regenerate
them with ``python -m polyrl.tasks.word_problems``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.tasks.common import SPLITS, ShippedSplits, check_split, hashed_split

__all__ = ["INSTRUCTION", "KINDS", "SHIPPED", "SPLITS", "make_word_problem_rows", "read_rows", "shipped_path", "skeleton_key"]

SHIPPED_SEED = 1234
SHIPPED_SIZES = {"train": 2000, "test": 200}
DATA_DIR = Path(__file__).parent / "data" / "word_problems"
# One in TEST_BUCKETS skeletons belongs to the test split.
TEST_BUCKETS = 8
# The answer format asked for. "Answer: N" rather than "#### N": a 135M chat model follows a
# plain-English format far more often (measured on SmolLM2-135M-Instruct; experiments/real/).
INSTRUCTION = 'Solve it step by step, then give the final answer as "Answer: <number>".'

NAMES = (
    ("Mia", "she"),
    ("Tom", "he"),
    ("Lena", "she"),
    ("Sam", "he"),
    ("Ava", "she"),
    ("Ben", "he"),
    ("Nora", "she"),
    ("Leo", "he"),
    ("Zoe", "she"),
    ("Omar", "he"),
)
OBJECTS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")


@dataclass(frozen=True)
class Kind:
    """A problem kind: how its three numbers are drawn, the question, and the worked answer."""

    name: str
    draw: Callable[[random.Random], tuple[int, int, int]]
    question: str  # str.format fields: name, pronoun (capitalised), things, a, b, c
    solve: Callable[[int, int, int], tuple[int, str]]  # (answer, worked steps)


def _buy_give(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(5, 30), rng.randint(2, 20), rng.randint(2, 9)


def _give_find(rng: random.Random) -> tuple[int, int, int]:
    a = rng.randint(6, 30)
    return a, rng.randint(1, a - 1), rng.randint(2, 15)


def _bags(rng: random.Random) -> tuple[int, int, int]:
    a, b = rng.randint(2, 6), rng.randint(2, 9)
    return a, b, rng.randint(1, a * b - 1)


def _three_adds(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(3, 30), rng.randint(2, 20), rng.randint(2, 20)


def _more_than(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(3, 25), rng.randint(2, 15), 0  # c unused: the second person has a + b


def _buy_one(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(5, 60), rng.randint(2, 30), 0


def _give_one(rng: random.Random) -> tuple[int, int, int]:
    a = rng.randint(6, 60)
    return a, rng.randint(1, a - 1), 0


# One-step problems (the first two kinds) make most of the task: SmolLM2-135M-Instruct answers
# 22% of them greedily but 3% of the two-step ones (64 test problems each, measured), and RL
# needs groups with a right answer to learn from; the two-step kinds leave room above.
ONE_STEP_KINDS = 2
ONE_STEP_SHARE = 0.6
KINDS = (
    Kind(
        "buy",
        _buy_one,
        "{name} has {a} {things}. {pronoun} buys {b} more. How many {things} does {name} have now?",
        lambda a, b, c: (a + b, f"{a} + {b} = {a + b}."),
    ),
    Kind(
        "give",
        _give_one,
        "{name} has {a} {things}. {pronoun} gives away {b}. How many {things} does {name} have now?",
        lambda a, b, c: (a - b, f"{a} - {b} = {a - b}."),
    ),
    Kind(
        "buy_give",
        _buy_give,
        "{name} has {a} {things}. {pronoun} buys {b} more, then gives {c} to a friend. How many {things} does {name} have now?",
        lambda a, b, c: (a + b - c, f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}."),
    ),
    Kind(
        "give_find",
        _give_find,
        "{name} has {a} {things}. {pronoun} gives away {b}, then finds {c} more. How many {things} does {name} have now?",
        lambda a, b, c: (a - b + c, f"{a} - {b} = {a - b}. {a - b} + {c} = {a - b + c}."),
    ),
    Kind(
        "bags",
        _bags,
        "{name} buys {a} bags with {b} {things} in each bag, then gives away {c} {things}. How many {things} does {name} have left?",
        lambda a, b, c: (a * b - c, f"{a} x {b} = {a * b}. {a * b} - {c} = {a * b - c}."),
    ),
    Kind(
        "three_adds",
        _three_adds,
        "A box holds {a} {things}. {name} puts in {b} more in the morning and {c} more in the evening. How many {things} are in the box now?",
        lambda a, b, c: (a + b + c, f"{a} + {b} = {a + b}. {a + b} + {c} = {a + b + c}."),
    ),
    Kind(
        "more_than",
        _more_than,
        "{name} has {a} {things}. A friend has {b} more {things} than {name}. How many {things} do they have together?",
        lambda a, b, c: (a + (a + b), f"{a} + {b} = {a + b}. {a} + {a + b} = {a + a + b}."),
    ),
)


def skeleton_key(kind: str, numbers: tuple[int, int, int]) -> str:
    """What makes two problems the same problem: the kind and its numbers (not names or objects)."""
    return f"{kind}:{numbers[0]},{numbers[1]},{numbers[2]}"


def problem_split(kind: str, numbers: tuple[int, int, int]) -> str:
    return hashed_split(skeleton_key(kind, numbers), TEST_BUCKETS)


def make_word_problem_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` problems of ``split`` with distinct skeletons, deterministic for ``seed``.

    Each row: ``{"prompt", "messages", "answer", "references", "solution", "kind", "skeleton",
    "id", "split"}``; ``messages`` holds the prompt as the one user message.
    """
    check_split(split)
    rng = random.Random(f"polyrl-word-problems-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * max(n, 1):
            raise ValueError(f"could not draw {n} distinct {split} word problems")
        one_step = rng.random() < ONE_STEP_SHARE
        kind = rng.choice(KINDS[:ONE_STEP_KINDS] if one_step else KINDS[ONE_STEP_KINDS:])
        numbers = kind.draw(rng)
        key = skeleton_key(kind.name, numbers)
        if key in seen or problem_split(kind.name, numbers) != split:
            continue
        seen.add(key)
        name, pronoun = rng.choice(NAMES)
        question = kind.question.format(
            name=name, pronoun=pronoun.capitalize(), things=rng.choice(OBJECTS), a=numbers[0], b=numbers[1], c=numbers[2]
        )
        prompt = f"{question} {INSTRUCTION}"
        answer, steps = kind.solve(*numbers)
        rows.append(
            {
                "prompt": prompt,
                "messages": [{"role": "user", "content": prompt}],
                "answer": str(answer),
                "references": [str(answer)],
                "solution": f"{steps} Answer: {answer}",
                "kind": kind.name,
                "skeleton": key,
                "id": f"wp-{split}-{len(rows):05d}",
                "split": split,
            }
        )
    return rows


SHIPPED = ShippedSplits(DATA_DIR, SHIPPED_SIZES, SHIPPED_SEED, make_word_problem_rows)
shipped_path = SHIPPED.path
read_rows = SHIPPED.read

if __name__ == "__main__":
    SHIPPED.regenerate()
