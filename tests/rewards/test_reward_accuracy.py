"""Answer extraction, exact/numeric matching, and the format check."""

import pytest

from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import Accuracy, Format
from polyrl.rewards.builtins.accuracy import extract_answer, extract_boxed, parse_number


def batch_with_answers(completions, answers, references=None):
    return RewardBatch(
        prompts=[""] * len(completions),
        completions=completions,
        references=references or [[] for _ in completions],
        fields=[{} if a is None else {"answer": a} for a in answers],
    )


def test_extraction_modes():
    text = "First 12 apples, so \\boxed{\\frac{1}{2}} then #### 42\nbye 7"
    assert extract_answer(text, "hash") == "42"
    assert extract_answer(text, "boxed") == "\\frac{1}{2}"
    assert extract_answer(text, "last_number") == "7"
    assert extract_answer(text, "auto") == "42"  # #### first
    assert extract_answer("so \\boxed{3} and 9", "auto") == "3"  # then boxed
    assert extract_answer("so 1,000 and -2.5", "auto") == "-2.5"  # then the last number
    assert extract_answer("no answer here", "auto") is None
    assert extract_boxed("\\boxed{a{b}c} and \\boxed{x}") == "x"  # the last one, braces balanced
    assert extract_boxed("\\boxed{a{b}c}") == "a{b}c"


def test_parse_number():
    assert parse_number("1,000") == 1000.0
    assert parse_number("3.0") == 3.0
    assert parse_number("$1,234.50") == 1234.5
    assert parse_number("50%") == 50.0
    assert parse_number("3/4") == 0.75
    assert parse_number("\\frac{1}{4}") == 0.25
    assert parse_number("1,00") is None  # not a thousands grouping
    assert parse_number("abc") is None


def test_exact_and_numeric_match():
    completions = [
        "The answer is 3.0",  # numeric: 3.0 == 3 -> 1
        "Total: 1,000 dollars",  # last number 1,000 == 1000 -> 1
        "#### Paris.",  # exact after normalisation (trailing period, case) -> 1
        "I think 41",  # 41 != 42 -> 0
        "no number",  # nothing extracted -> 0
        "anything",  # no answer in the row -> None
    ]
    module = Accuracy()
    assert module.score(batch_with_answers(completions, ["3", "1000", "paris", "42", "5", None])) == [
        1.0,
        1.0,
        1.0,
        0.0,
        0.0,
        None,
    ]


def test_answer_from_reference_and_gsm8k_solution():
    batch = batch_with_answers(
        ["so \\boxed{18}", "it is 72"],
        [None, "Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72"],
        references=[["18"], []],
    )
    # row 0: no answer field -> first reference "18"; row 1: gold reduced to the text after ####
    assert Accuracy().score(batch) == [1.0, 1.0]


def test_tolerance_and_reward_values():
    batch = batch_with_answers(["x = 3.14159"], ["3.1416"])
    # |3.14159 - 3.1416| = 1e-5 > default abs tolerance 1e-6 -> incorrect
    assert Accuracy().score(batch) == [0.0]
    assert Accuracy(abs_tolerance=1e-4).score(batch) == [1.0]
    assert Accuracy(rel_tolerance=1e-5).score(batch) == [1.0]  # 1e-5 / 3.1416 = 3.2e-6 relative
    assert Accuracy(numeric=False).score(batch_with_answers(["3.0"], ["3"])) == [0.0]
    assert Accuracy(correct=2.0, incorrect=-1.0).score(batch_with_answers(["3", "4"], ["3", "3"])) == [2.0, -1.0]
    assert Accuracy(extract="full").score(batch_with_answers(["  Yes. "], ["yes"])) == [1.0]
    assert Accuracy(case_sensitive=True, extract="full").score(batch_with_answers(["Yes"], ["yes"])) == [0.0]
    with pytest.raises(RewardConfigError, match="extract must be one of"):
        Accuracy(extract="first_number")


def test_format_fullmatch_and_search():
    completions = ["<think>a\nb</think> <answer>4</answer>", "<answer>4</answer>", "  <think>x</think><answer>5</answer>\n"]
    batch = RewardBatch(prompts=[""] * 3, completions=completions)
    strict = Format(pattern=r"<think>.*?</think>\s*<answer>.*?</answer>")
    # DOTALL by default, so the newline inside <think> is fine; the third is stripped first
    assert strict.score(batch) == [1.0, 0.0, 1.0]
    assert Format(pattern=r"<answer>\d+</answer>", match="search", matched=0.5, unmatched=-0.5).score(batch) == [0.5, 0.5, 0.5]
    assert Format(pattern=r"<think>.*</think>.*", flags=[]).score(batch) == [0.0, 0.0, 1.0]  # no DOTALL
    assert Format(pattern=r"<ANSWER>.*", match="search", flags=["IGNORECASE"]).score(batch) == [1.0, 1.0, 1.0]
    with pytest.raises(RewardConfigError, match="pattern"):
        Format()
    with pytest.raises(RewardConfigError, match="bad pattern"):
        Format(pattern="(")
    with pytest.raises(RewardConfigError, match="unknown regex flag"):
        Format(pattern="a", flags=["GLOBAL"])
