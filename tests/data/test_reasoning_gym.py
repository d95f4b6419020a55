"""Data source ``reasoning_gym:<task>`` and reward module ``reasoning_gym`` with the real package:
train and held-out rows disjoint, scoring by hand, bad names refused, a short training run."""

from __future__ import annotations

import json
import math
import sys

import pytest

from polyrl.config.schema import resolve_arms
from polyrl.data import reasoning_gym as rg_source
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import DataConfigError, check_prompt_source, load_prompt_dataset
from polyrl.data.splits import overlap_count
from polyrl.rewards import RewardBatch, RewardModuleError, RewardSpec
from polyrl.rewards.base import RewardConfigError
from polyrl.rewards.builtins.reasoning_gym import make_entry

pytest.importorskip("reasoning_gym")  # the envs extra; make setup installs it, so CI runs these

SMALL = "reasoning_gym:basic_arithmetic?size=40&test_size=20&max_terms=2&max_digits=2"
# 1-digit, 2-term sums: about 100 questions in all, so held-out draws repeat training questions.
TINY_SPACE = "reasoning_gym:chain_sum?size=60&test_size=30&min_terms=2&max_terms=2&min_digits=1&max_digits=1"


def _rows(source: str, split: str) -> list[dict]:
    return [dict(row) for row in load_prompt_dataset(source, split)]


def _score(rows: list[dict], completions: list[str], **params) -> list[float | None]:
    module = RewardSpec(module="reasoning_gym", params=params).build()
    module.setup()
    return module.score(RewardBatch.from_rows(rows, completions))


def test_train_and_held_out_rows_are_fixed_and_disjoint():
    train, test = _rows(SMALL, "train"), _rows(SMALL, "test")
    assert (len(train), len(test)) == (40, 20)
    assert not {r["question"] for r in test} & {r["question"] for r in train}
    # The check periodic evaluation runs on its datasets (same prompt text and images).
    assert overlap_count(rows_to_prompt_samples(test), rows_to_prompt_samples(train)) == 0
    assert train[0]["prompt"] == f"{train[0]['question']}\n\n{rg_source.ANSWER_INSTRUCTION}"
    assert [r["id"] for r in train[:2]] == ["rg-basic_arithmetic-train-00000", "rg-basic_arithmetic-train-00001"]
    # A row's coordinates make the same item again: what the reward scores with.
    for row in train[:3] + test[:3]:
        _, entry = make_entry(row["reasoning_gym"])
        assert (entry["question"], entry["answer"]) == (row["question"], row["answer"])
    seeded = "reasoning_gym:basic_arithmetic?size=40&test_size=20&max_terms=2&max_digits=2&seed=7"
    assert [r["question"] for r in _rows(seeded, "train")] != [r["question"] for r in train]


def test_held_out_draws_skip_training_questions_of_a_small_space():
    train, test = _rows(TINY_SPACE, "train"), _rows(TINY_SPACE, "test")
    questions = [r["question"] for r in test]
    assert len(test) == 30 and len(set(questions)) == 30
    assert not set(questions) & {r["question"] for r in train}
    # Held-out items whose questions are training (or earlier held-out) questions were skipped:
    # the first 30 draws gave too few, so the generator grew to 60 and the 30th kept item is
    # draw 41 (11 skipped; reasoning-gym 0.1.25, the pinned version).
    coordinates = json.loads(test[-1]["reasoning_gym"])
    assert (coordinates["index"], coordinates["config"]["size"]) == (41, 60)
    too_many = TINY_SPACE.replace("test_size=30", "test_size=200")
    with pytest.raises(DataConfigError, match=r"short of test_size=200"):
        _rows(too_many, "test")


def test_a_right_a_wrong_and_an_unreadable_answer_by_hand():
    rows = _rows(SMALL, "test")[:1] * 5
    answer = rows[0]["answer"]
    wrong = "x" if answer != "x" else "y"
    completions = [
        f"Let me think. <answer>{answer}</answer>",  # right: 1.0
        f"<answer>{wrong}</answer>",  # wrong: 0.0
        answer,  # no <answer> tags: no answer, 0.0
        f"<answer>{answer}0</answer>",  # the oracle inside a longer answer: len(oracle)/len(answer) (the task's rule)
        f"<answer>1</answer> then <answer>{answer}</answer>",  # the last pair counts: 1.0
    ]
    scores = _score(rows, completions)
    assert scores[:3] == [1.0, 0.0, 0.0]
    assert scores[3] == pytest.approx(len(answer) / (len(answer) + 1))
    assert scores[4] == 1.0
    assert _score(rows[:1], [f"  {answer}  "], extract="full") == [1.0]


def test_the_last_number_of_an_untagged_answer():
    """extract: last_number, for a chat model that answers in a sentence and never writes the tags."""
    row = _rows("reasoning_gym:gcd?max_value=60&size=4&test_size=2", "test")[0]
    gold = int(row["answer"])
    completions = [
        f"The GCD of these numbers is {gold}.",  # right: 1.0
        f"The GCD is {gold + 1}, not {gold}... no: {gold + 1}",  # the last number counts: wrong, 0.0
        "I cannot tell.",  # no number: no answer, 0.0
        f"<answer>{gold}</answer>",  # the tags' number is the last one too: 1.0
    ]
    assert _score([row] * 4, completions, extract="last_number") == [1.0, 0.0, 0.0, 1.0]
    assert _score([row], [f"The GCD is {gold}."]) == [0.0]  # the default (tags) reads no answer there
    # basic_arithmetic compares strings: a thousands comma is dropped before it does.
    big = next(r for r in _rows("reasoning_gym:basic_arithmetic?size=60&test_size=2&max_terms=2&max_digits=4", "train")
               if abs(int(r["answer"])) >= 1000)  # fmt: skip
    value = int(big["answer"])
    assert _score([big], [f"It is {value:,}."], extract="last_number") == [1.0]
    with pytest.raises(RewardConfigError, match=r"'tags', 'full', 'last_number'"):
        RewardSpec(module="reasoning_gym", params={"extract": "first_number"}).build()


def test_a_task_that_cannot_read_the_answer_scores_zero():
    # prime_factorization's score_answer raises ValueError on a word: a wrong answer, not a crash.
    row = _rows("reasoning_gym:prime_factorization?size=4&test_size=2", "test")[0]
    assert _score([row], ["<answer>banana</answer>"]) == [0.0]
    assert _score([row], [f"<answer>{row['answer']}</answer>"]) == [1.0]


def test_rows_from_elsewhere_are_refused_by_the_reward():
    with pytest.raises(RewardModuleError, match=r"columns answer"):
        _score([{"prompt": "1+1", "answer": "2"}], ["<answer>2</answer>"])


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("reasoning_gym:basic_arithmetc", r"no task 'basic_arithmetc'; did you mean basic_arithmetic.*allowed tasks"),
        ("reasoning_gym:basic_arithmetic?max_term=3", r"no param 'max_term' \(did you mean max_terms.*accepts: min_terms"),
        ("reasoning_gym:basic_arithmetic?max_terms=two", r"param max_terms='two' is not an int"),
        (
            "reasoning_gym:basic_arithmetic?min_terms=5&max_terms=2",
            r"generator refuses these params.*max_terms must be >= min_terms",
        ),
        ("reasoning_gym:basic_arithmetic?size=3&size=4", r"\['size'\] given more than once"),
        ("reasoning_gym:basic_arithmetic?answer_format=xml", r"answer_format 'xml' is not one of \['tags', 'none'\]"),
        ("reasoning_gym:basic_arithmetic?test_size=0", r"test_size must be at least 1"),
        ("reasoning_gym:basic_arithmetic?max_terms=2&&size=4", r"name=value pairs joined by '&'; '' is not one"),
        ("reasoning_gym:basic_arithmetic?max_terms", r"'max_terms' is not one"),
    ],
)
def test_bad_tasks_and_params_are_refused_by_name(source, message):
    with pytest.raises(DataConfigError, match=message):
        check_prompt_source(source, "train")


def test_a_plus_sign_in_a_param_is_a_plus_sign():
    """operators=["+","-"] (the docs' example): a web form's '+' for a space made it [" ", "-"],
    which the generator refused ("unsupported operator:  "). A %XX escape is still decoded."""
    from polyrl.data.source_params import source_params

    assert source_params("s", 'operators=["+","-"]&max_terms=2') == [("operators", '["+","-"]'), ("max_terms", "2")]
    assert source_params("s", "a=x%26y") == [("a", "x&y")]
    rows = _rows('reasoning_gym:basic_arithmetic?size=8&test_size=4&max_terms=2&operators=["+"]', "train")
    # Sums only ("Calculate 2 + -1.": a negative operand, not the '-' operator, which has spaces around it).
    assert len(rows) == 8 and all(" + " in row["question"] and " - " not in row["question"] for row in rows)


def test_bad_splits_and_holdout_are_refused():
    with pytest.raises(DataConfigError, match=r"unknown split 'validation'; allowed: \['train', 'test'\]"):
        load_prompt_dataset(SMALL, "validation")
    with pytest.raises(DataConfigError, match=r"holdout splits a single local file"):
        load_prompt_dataset(SMALL, "train", holdout=0.1)


def test_a_missing_package_names_the_extra(monkeypatch):
    rg_source.parse_source.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    try:
        with pytest.raises(DataConfigError, match=r"pip install 'polyrl\[envs\]'"):
            check_prompt_source("reasoning_gym:chain_sum", "train")
    finally:
        rg_source.parse_source.cache_clear()


def test_an_eval_suite_scores_each_dataset_by_its_own_rule():
    from polyrl.evals.suite import parse_suite

    suite = parse_suite(
        {
            "name": "mixed",
            "datasets": [
                {"name": "rg", "source": SMALL, "split": "test", "accuracy": {"module": "reasoning_gym"}},
                {"name": "arith", "source": "arithmetic", "split": "test"},
            ],
            "metrics": {"accuracy": {"extract": "hash"}},
        }
    )
    assert suite.accuracy_params(suite.datasets[0]) == {"module": "reasoning_gym"}
    assert suite.accuracy_params(suite.datasets[1]) == {"extract": "hash"}
    from polyrl.evals.harness import SuiteRunner

    runner = SuiteRunner(suite, limit=2)
    assert [type(d.accuracy).__name__ for d in runner.datasets] == ["ReasoningGymScore", "Accuracy"]


def test_the_shipped_suite_scores_each_task_by_its_rule():
    from polyrl.evals.harness import SuiteRunner

    runner = SuiteRunner("reasoning_gym", limit=2)  # experiments/evals/reasoning_gym.yaml
    assert [(d.spec.label, len(d.samples), type(d.accuracy).__name__) for d in runner.datasets] == [
        ("basic_arithmetic", 2, "ReasoningGymScore"),
        ("chain_sum", 2, "ReasoningGymScore"),
    ]


@pytest.mark.slow
def test_a_few_training_steps_on_a_reasoning_gym_source(tmp_path, tiny_experiment):
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(
        data={"source": SMALL},
        rewards=[{"module": "reasoning_gym", "params": {"extract": "full"}}],
        tracking={"accuracy_reward": "reasoning_gym"},
        train={"steps": 2, "micro_batch_size": 8},
    )
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        history = arm.loop().run()
    finally:
        arm.close()
    assert len(history) == 2
    for metrics in history:
        assert metrics["reward/unscored"] == 0.0 and 0.0 <= metrics["reward/reasoning_gym/mean"] <= 1.0
        assert 0.0 <= metrics["train/accuracy"] <= 1.0 and math.isfinite(metrics["actor/loss"])
    assert len(arm.sampler.samples) == 40 and all(s.fields["reasoning_gym"] for s in arm.sampler.samples)
