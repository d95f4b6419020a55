"""The eval harness's accuracy is polyrl's one definition (also train/accuracy): the share of
scored samples whose accuracy score is > 0 (polyrl.rewards.summary.accuracy_share)."""

from __future__ import annotations

import pytest

from polyrl.evals import SuiteRunner, parse_suite
from polyrl.rewards.summary import accuracy_share

ROWS = [{"id": "a", "prompt": "Q: 1+1=? A:", "answer": "2"}, {"id": "b", "prompt": "Q: 2+2=? A:", "answer": "4"}]
SCRIPT = {"Q: 1+1=? A:": [" #### 2", " #### 3"], "Q: 2+2=? A:": [" #### 4", " #### 4"]}  # 3 of 4 right


def test_eval_accuracy_is_the_share_above_zero_whatever_the_correct_score(tmp_path, jsonl, scripted_engine):
    # correct: 3, incorrect: -1. A mean of the scores would say (3·3 − 1)/4 = 2.0.
    suite = parse_suite(
        {
            "name": "acc",
            "datasets": [{"name": "add", "source": str(jsonl(tmp_path / "add.jsonl", ROWS))}],
            "generation": {"decoding": "sample", "n": 2, "max_tokens": 8},
            "metrics": {"accuracy": {"extract": "hash", "correct": 3.0, "incorrect": -1.0}, "pass_at_k": [1]},
        }
    )
    result = SuiteRunner(suite).run(scripted_engine(SCRIPT))
    assert [row["correct"] for row in result.rows] == [3.0, -1.0, 3.0, 3.0]
    assert result.metrics["add/accuracy"] == 0.75 == accuracy_share([row["correct"] for row in result.rows])
    assert result.metrics["add/pass_at_1"] == pytest.approx(0.75)  # pass@1 counts correct samples the same way


def test_eval_reports_the_mean_length_of_right_and_of_wrong_answers(tmp_path, jsonl, scripted_engine):
    # One token per character (ScriptedEngine). Right: " #### 2" (7), " #### 4" (7), " so #### 4" (10)
    # → (7 + 7 + 10) / 3 = 8.0; wrong: " it is #### 3" (13) → 13.0. Mean of all four: 37 / 4 = 9.25.
    script = {"Q: 1+1=? A:": [" #### 2", " it is #### 3"], "Q: 2+2=? A:": [" #### 4", " so #### 4"]}
    suite = parse_suite(
        {
            "name": "acc",
            "datasets": [{"name": "add", "source": str(jsonl(tmp_path / "add.jsonl", ROWS))}],
            "generation": {"decoding": "sample", "n": 2, "max_tokens": 16},
            "metrics": {"accuracy": {"extract": "hash"}, "length": True},
        }
    )
    metrics = SuiteRunner(suite).run(scripted_engine(script)).metrics
    assert metrics["add/length/mean"] == pytest.approx(9.25)
    assert metrics["add/length/correct_mean"] == pytest.approx(8.0)
    assert metrics["add/length/wrong_mean"] == pytest.approx(13.0)


def test_length_by_correctness_leaves_unscored_samples_and_empty_sides_out():
    from polyrl.rewards.summary import length_by_correctness

    # Right (> 0): 4 and 6 → 5.0; wrong (0 and -1): 10 and 20 → 15.0; the None sample (99) counts in neither.
    assert length_by_correctness([4, 10, 99, 6, 20], [1.0, 0.0, None, 2.0, -1.0]) == {"correct_mean": 5.0, "wrong_mean": 15.0}
    assert length_by_correctness([3, 5], [0.0, 0.0]) == {"wrong_mean": 4.0}  # no right answer: no correct_mean (not 0)
    with pytest.raises(ValueError, match="2 lengths for 1 accuracy scores"):
        length_by_correctness([1, 2], [1.0])
