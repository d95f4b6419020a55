"""The synthetic arithmetic task: determinism, disjoint splits, verifiable answers, shipped files."""

from __future__ import annotations

import re

import pytest

from polyrl.tasks import arithmetic
from polyrl.tasks.arithmetic import (
    SHIPPED_SEED,
    SHIPPED_SIZES,
    extract_answer,
    make_arithmetic_rows,
    parse_prompt,
    rows_to_jsonl,
    shipped_path,
    worked_solution,
)


def test_rows_are_deterministic_for_a_seed():
    assert make_arithmetic_rows(200, seed=7, split="train") == make_arithmetic_rows(200, seed=7, split="train")
    assert make_arithmetic_rows(200, seed=7, split="train") != make_arithmetic_rows(200, seed=8, split="train")


def test_prefix_property():
    # Asking for more rows extends the sequence rather than reshuffling it.
    assert make_arithmetic_rows(150, seed=3, split="test")[:50] == make_arithmetic_rows(50, seed=3, split="test")


@pytest.mark.parametrize("seed_train, seed_test", [(0, 0), (1, 2)])
def test_splits_are_disjoint(seed_train, seed_test):
    train = {row["prompt"] for row in make_arithmetic_rows(1500, seed=seed_train, split="train")}
    test = {row["prompt"] for row in make_arithmetic_rows(200, seed=seed_test, split="test")}
    assert len(train) == 1500 and len(test) == 200  # distinct within a split
    assert not train & test


def test_every_solution_verifies():
    rows = make_arithmetic_rows(SHIPPED_SIZES["train"], seed=SHIPPED_SEED, split="train") + make_arithmetic_rows(
        SHIPPED_SIZES["test"], seed=SHIPPED_SEED, split="test"
    )
    for row in rows:
        a, op, b = parse_prompt(row["prompt"])
        expected = str(eval(f"{a}{op}{b}"))  # noqa: S307 - the prompt is our own digits-and-operator string
        assert row["answer"] == expected
        assert row["references"] == [expected]
        assert row["solution"].endswith(f"#### {expected}")
        assert extract_answer(row["solution"]) == expected
        assert int(expected) >= 0
        assert set(row) == {"prompt", "answer", "references", "solution", "id", "split"}


def test_both_solution_forms_present_and_lengths_vary():
    rows = make_arithmetic_rows(1500, seed=0, split="train")
    long_rows = [row for row in rows if row["solution"].startswith(" work: ")]
    short_rows = [row for row in rows if row["solution"].startswith(" #### ")]
    assert len(long_rows) + len(short_rows) == len(rows)
    assert abs(len(long_rows) / len(rows) - arithmetic.LONG_FRACTION) < 0.06
    lengths = {len(row["solution"]) for row in rows}
    assert min(lengths) <= 9 and max(lengths) >= 35


@pytest.mark.parametrize(
    "a, op, b, long_form",
    [
        (37, "+", 48, " work: 7+8=15, carry 1; 3+4+1=8. #### 85"),
        (52, "-", 17, " work: 12-7=5, borrow 1; 5-1-1=3. #### 35"),
        (95, "+", 17, " work: 5+7=12, carry 1; 9+1+1=11. #### 112"),
        (3, "+", 4, " work: 3+4=7. #### 7"),
        (100, "-", 99, " work: 10-9=1, borrow 1; 10-9-1=0, borrow 1; 1-1=0. #### 1"),
    ],
)
def test_worked_solution_forms(a, op, b, long_form):
    assert worked_solution(a, op, b, "long") == long_form
    assert worked_solution(a, op, b, "short") == f" #### {eval(f'{a}{op}{b}')}"  # noqa: S307


def test_long_steps_are_arithmetically_true():
    for row in make_arithmetic_rows(500, seed=5, split="train"):
        for lhs, rhs in re.findall(r"([\d+-]+)=(\d+)", row["solution"]):
            assert eval(lhs) == int(rhs), row  # noqa: S307


def test_prompts_are_short():
    rows = make_arithmetic_rows(1000, seed=0, split="train")
    assert max(len(row["prompt"]) for row in rows) <= 16
    assert max(len(row["prompt"]) + len(row["solution"]) for row in rows) <= 80


def test_shipped_files_equal_generator_output():
    for split, size in SHIPPED_SIZES.items():
        path = shipped_path(split)
        assert path.read_text() == rows_to_jsonl(make_arithmetic_rows(size, seed=SHIPPED_SEED, split=split))
        assert path.stat().st_size < 2_000_000


def test_bad_split_and_style():
    with pytest.raises(ValueError, match="split"):
        make_arithmetic_rows(3, seed=0, split="validation")
    with pytest.raises(ValueError, match="style"):
        worked_solution(1, "+", 2, "medium")
    assert extract_answer("no answer here") is None
    assert extract_answer(" 1+2=3. #### 4 #### 03") == "3"
    assert arithmetic.problem_split("Q: 1+1=? A:") in ("train", "test")
