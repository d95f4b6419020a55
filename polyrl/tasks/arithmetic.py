"""A deterministic synthetic arithmetic task with verifiable answers.

Prompts are short (the policies use a character-level tokenizer, so every character is a
token)::

    Q: 37+48=? A:

and every row carries the integer answer as a string plus one worked solution. Solutions come
in two forms of different length so that response length can move under RL:

* short:  `` #### 85``
* long, one step per digit column (least significant first)::

      `` work: 7+8=15, carry 1; 3+4+1=8. #### 85``
      `` work: 12-7=5, borrow 1; 5-1-1=3. #### 35``      (52-17)

The final answer is always the last thing in a solution, after ``####``, so the accuracy reward
(extraction mode ``hash`` / ``auto``) verifies it.

Operations: addition and subtraction (never negative results) of a 1–2 digit number and a
one-digit number. Every held-out problem is then built from digit facts (units ± units, a
carry or borrow into the tens) that the train split teaches, so held-out accuracy measures
whether the policy learned the procedure, not a lookup table; a 0.3M-parameter model reaches
roughly 40 % greedy accuracy after a two-minute warm-up on two cores, which leaves RL room. Train and test rows are disjoint by construction: a problem's split is a
hash of its prompt, so no prompt can land in both, whatever ``n`` is asked for.

Chat form (the ``arithmetic_chat`` source, for pretrained chat models): the same rows and
splits, each prompt re-worded as a question in one user message (:func:`chat_row`)::

    What is 37 + 48? Answer with the number only.

The answer check is unchanged (the accuracy reward's ``auto`` extraction falls back to the
last number when there is no ``####``). The ``arithmetic_chat_free`` source asks the bare
question (``What is 37 + 48?``, :func:`free_question`) and leaves the answer's form and length
to the model: SmolLM2-135M-Instruct answers 34% of 32 test questions greedily, in 30 tokens on
average, from "37 + 48 = 85." to a paragraph of working.

The shipped files ``polyrl/tasks/data/arithmetic/{train,test}.jsonl`` are exactly
``make_arithmetic_rows(SHIPPED_SIZES[split], seed=SHIPPED_SEED, split=split)``; regenerate them
with ``python -m polyrl.tasks.arithmetic``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from polyrl.tasks.common import (
    SPLITS,
    ShippedSplits,
    check_split,
    hashed_split,
    rows_to_jsonl,  # noqa: F401  (re-exported: callers write rows through the task)
)

SHIPPED_SEED = 1234
# Near the number of distinct problems per split (about 1,750 train / 240 test).
SHIPPED_SIZES = {"train": 1500, "test": 200}
DATA_DIR = Path(__file__).parent / "data" / "arithmetic"

# Probability that the first operand has two digits (else one); the second always has one.
TWO_DIGIT_FIRST_OPERAND = 0.7
# Share of rows whose stored solution is the long, step-by-step form.
LONG_FRACTION = 0.6
# First word of every long solution: the choice between the short and the long form is then
# one token (``#`` vs ``w``), so a policy's length preference is a single, RL-movable decision
# rather than being entangled with copying the first digit.
LONG_MARKER = "work:"
# One in TEST_BUCKETS of all problems belongs to the test split.
TEST_BUCKETS = 8

_PROMPT_RE = re.compile(r"Q: (\d+)([+-])(\d+)=\? A:")
_ANSWER_RE = re.compile(r"####\s*(-?\d+)")


def format_prompt(a: int, op: str, b: int) -> str:
    return f"Q: {a}{op}{b}=? A:"


def parse_prompt(prompt: str) -> tuple[int, str, int]:
    """Inverse of ``format_prompt``: ``"Q: 37+48=? A:"`` -> ``(37, "+", 48)``."""
    match = _PROMPT_RE.fullmatch(prompt.strip())
    if match is None:
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return int(match.group(1)), match.group(2), int(match.group(3))


def compute_answer(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    raise ValueError(f"unknown operation {op!r}")


def extract_answer(text: str) -> str | None:
    """The integer after the last ``####`` in ``text`` (as a string), or ``None``."""
    matches = _ANSWER_RE.findall(text)
    return str(int(matches[-1])) if matches else None


def _digits(number: int) -> list[int]:
    """Decimal digits, least significant first."""
    return [int(ch) for ch in reversed(str(number))]


def _long_addition(a: int, b: int) -> str:
    da, db = _digits(a), _digits(b)
    steps: list[str] = []
    carry = 0
    for column in range(max(len(da), len(db))):
        terms = [str(d[column]) for d in (da, db) if column < len(d)]
        if carry:
            terms.append(str(carry))
        total = sum(int(t) for t in terms)
        step = f"{'+'.join(terms)}={total}"
        carry = total // 10
        if carry and column < max(len(da), len(db)) - 1:
            step += f", carry {carry}"
        steps.append(step)
    return "; ".join(steps)


def _long_subtraction(a: int, b: int) -> str:
    if a < b:
        raise ValueError("the task never produces negative results")
    da, db = _digits(a), _digits(b)
    steps: list[str] = []
    borrow = 0
    for column in range(len(da)):
        top = da[column]
        subtrahends = [str(db[column])] if column < len(db) else []
        if borrow:
            subtrahends.append(str(borrow))
        value = top - sum(int(s) for s in subtrahends)
        next_borrow = 0
        if value < 0:
            top += 10
            value += 10
            next_borrow = 1
        step = "-".join([str(top)] + subtrahends) + f"={value}"
        if next_borrow:
            step += f", borrow {next_borrow}"
        borrow = next_borrow
        steps.append(step)
    return "; ".join(steps)


def worked_solution(a: int, op: str, b: int, style: str = "long") -> str:
    """A completion for ``format_prompt(a, op, b)``; it starts with a space and ends in ``#### n``."""
    answer = compute_answer(a, op, b)
    if style == "short":
        return f" #### {answer}"
    if style != "long":
        raise ValueError(f"unknown solution style {style!r}; allowed: 'short', 'long'")
    body = _long_addition(a, b) if op == "+" else _long_subtraction(a, b)
    return f" {LONG_MARKER} {body}. #### {answer}"


def problem_split(prompt: str) -> str:
    """The split a problem belongs to, fixed by a hash of its prompt (seed-independent)."""
    return hashed_split(prompt, TEST_BUCKETS)


def _operands(rng: random.Random) -> tuple[int, int]:
    first = rng.randint(10, 99) if rng.random() < TWO_DIGIT_FIRST_OPERAND else rng.randint(0, 9)
    return first, rng.randint(0, 9)


def make_arithmetic_rows(
    n: int,
    *,
    seed: int,
    split: str,
    long_fraction: float = LONG_FRACTION,
) -> list[dict[str, Any]]:
    """``n`` distinct problems of ``split`` ("train" or "test"), deterministic for ``seed``.

    Each row: ``{"prompt", "answer", "references": [answer], "solution", "id", "split"}``.
    """
    check_split(split)
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"long_fraction must be in [0, 1], got {long_fraction}")
    rng = random.Random(f"polyrl-arithmetic-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * max(n, 1):
            raise ValueError(f"could not draw {n} distinct {split} problems")
        op = rng.choice("+-")
        a, b = _operands(rng)
        if op == "-" and a < b:
            a, b = b, a
        prompt = format_prompt(a, op, b)
        if prompt in seen or problem_split(prompt) != split:
            continue
        seen.add(prompt)
        style = "long" if rng.random() < long_fraction else "short"
        answer = str(compute_answer(a, op, b))
        rows.append(
            {
                "prompt": prompt,
                "answer": answer,
                "references": [answer],
                "solution": worked_solution(a, op, b, style),
                "id": f"arith-{split}-{len(rows):05d}",
                "split": split,
            }
        )
    return rows


SHIPPED = ShippedSplits(DATA_DIR, SHIPPED_SIZES, SHIPPED_SEED, make_arithmetic_rows)
shipped_path = SHIPPED.path
read_rows = SHIPPED.read


def chat_question(a: int, op: str, b: int) -> str:
    """The problem as a chat user would ask it: ``What is 37 + 48? Answer with the number only.``"""
    return f"What is {a} {op} {b}? Answer with the number only."


def chat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A shipped row in chat form: ``prompt`` re-worded as a question, and ``messages`` holding it
    as the one user message (the data loader formats them through the chat template)."""
    question = chat_question(*parse_prompt(row["prompt"]))
    return {"prompt": question, "messages": [{"role": "user", "content": question}]}


def free_question(a: int, op: str, b: int) -> str:
    """The problem as a bare chat question, ``What is 37 + 48?``: how to answer (a number, an
    equation, a paragraph of working) is the model's choice."""
    return f"What is {a} {op} {b}?"


def free_chat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A shipped row in chat form with no answer format asked (the ``arithmetic_chat_free`` source)."""
    question = free_question(*parse_prompt(row["prompt"]))
    return {"prompt": question, "messages": [{"role": "user", "content": question}]}


class _ChatSplits:
    """A chat-form source as the prompt loader sees a task module: the shipped files, each row
    mapped by ``map_row`` (``arithmetic_chat``: :func:`chat_row`; ``arithmetic_chat_free``:
    :func:`free_chat_row`)."""

    SPLITS = SPLITS

    def __init__(self, map_row):
        # The loader maps every shipped row through this (polyrl/data/prompts.py).
        self.map_row = map_row

    @staticmethod
    def shipped_path(split: str) -> Path:
        return shipped_path(split)


CHAT = _ChatSplits(chat_row)
CHAT_FREE = _ChatSplits(free_chat_row)

if __name__ == "__main__":
    SHIPPED.regenerate()
