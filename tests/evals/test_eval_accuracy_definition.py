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
    suite = parse_suite({
        "name": "acc", "datasets": [{"name": "add", "source": str(jsonl(tmp_path / "add.jsonl", ROWS))}],
        "generation": {"decoding": "sample", "n": 2, "max_tokens": 8},
        "metrics": {"accuracy": {"extract": "hash", "correct": 3.0, "incorrect": -1.0}, "pass_at_k": [1]},
    })
    result = SuiteRunner(suite).run(scripted_engine(SCRIPT))
    assert [row["correct"] for row in result.rows] == [3.0, -1.0, 3.0, 3.0]
    assert result.metrics["add/accuracy"] == 0.75 == accuracy_share([row["correct"] for row in result.rows])
    assert result.metrics["add/pass_at_1"] == pytest.approx(0.75)  # pass@1 counts correct samples the same way
