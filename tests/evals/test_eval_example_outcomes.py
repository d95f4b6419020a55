"""The per-example outcome rows every evaluation writes (polyrl/evals/example_outcomes.py)."""

from __future__ import annotations

import json

from polyrl.core.types import PromptSample
from polyrl.evals import SuiteRunner
from polyrl.evals.example_outcomes import example_files, example_id, examples_artifact
from polyrl.evals.periodic import PeriodicEvaluator

ROWS = [
    {"id": "q-seven", "prompt": "3+4=?", "answer": "7"},
    {"prompt": "2+2=?", "answer": "4"},  # no id column: the id is a hash of the prompt
]
# Two completions per prompt; a completion's length is its number of characters (ScriptedEngine).
SCRIPT = {"3+4=?": ["7", "it is 8"], "2+2=?": ["4", "four…"]}


def _suite(tmp_path, jsonl, suite_file):
    jsonl(tmp_path / "d.jsonl", ROWS)
    return suite_file(
        tmp_path / "arith.yaml",
        {
            "name": "arith",
            "datasets": {"name": "d", "source": "d.jsonl"},
            "generation": {"decoding": "sample", "n": 2, "max_tokens": 8},
            "metrics": {"accuracy": {"extract": "last_number"}},
        },
    )


def test_example_rows_of_a_periodic_evaluation(tmp_path, jsonl, suite_file, scripted_engine):
    evaluator = PeriodicEvaluator(SuiteRunner(_suite(tmp_path, jsonl, suite_file)), arm="grpo", seed=3)
    result = evaluator(scripted_engine(SCRIPT), 20)
    assert list(result.artifacts) == ["eval_examples/arith/step_00020.jsonl"]
    rows = [json.loads(line) for line in result.artifacts["eval_examples/arith/step_00020.jsonl"].splitlines()]
    hashed = example_id(PromptSample("2+2=?"))
    assert hashed.startswith("sha256:") and hashed == example_id(PromptSample("2+2=?", fields={"answer": "x"}))
    # "7" right, "it is 8" wrong (last number 8), "4" right, "four" (truncated) has no number: wrong.
    assert [(r["example_id"], r["sample"], r["correct"], r["score"], r["length"]) for r in rows] == [
        ("q-seven", 0, True, 1.0, 1),
        ("q-seven", 1, False, 0.0, 7),
        (hashed, 0, True, 1.0, 1),
        (hashed, 1, False, 0.0, 4),
    ]
    assert {(r["arm"], r["seed"], r["step"], r["dataset"]) for r in rows} == {("grpo", 3, 20, "d")}
    assert [r["sample_ref"] for r in rows][-1] == "eval_samples/step_00020.json#3"
    assert rows[3]["finish_reason"] == "length" and rows[0]["prompt"] == "3+4=?"
    # The row a sample_ref points at is that completion in the sample table the hook logs.
    assert result.rows[3]["completion"] == "four" and result.rows[3]["example_id"] == hashed


def test_example_file_size_per_200_examples(tmp_path, jsonl, suite_file, scripted_engine):
    """One completion per prompt, 200 prompts of ~60 characters: the file stays small (docs/evaluation.md)."""
    rows = [
        {"prompt": f"Question {i}: what is {i} plus {i}? Answer with a number only.", "answer": str(2 * i)} for i in range(200)
    ]
    jsonl(tmp_path / "big.jsonl", rows)
    suite = suite_file(
        tmp_path / "big.yaml",
        {
            "name": "big",
            "datasets": {"name": "b", "source": "big.jsonl"},
            "generation": {"decoding": "greedy", "max_tokens": 8},
            "metrics": {"accuracy": {"extract": "last_number"}},
        },
    )
    result = SuiteRunner(suite).run(scripted_engine({row["prompt"]: [row["answer"]] for row in rows}))
    files = example_files(result, arm="grpo_baseline", seed=12, step=1000, samples_file="eval_samples/step_01000.json")
    text = files[examples_artifact("big", 1000)]
    assert len(text.splitlines()) == 200
    assert len(text.encode()) < 70_000  # measured 58 kB (≈ 290 bytes a row); gzip would make it 5 kB


def test_a_chat_rows_snippet_is_the_question_not_the_template():
    from polyrl.evals.example_outcomes import example_outcome_rows

    shown = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>"
    rows = example_outcome_rows(
        [{"example_id": "a", "prompt": shown, "question": "What is 2+2?", "correct": 1.0}],
        arm="x",
        seed=0,
        step=4,
        samples_file=None,
    )
    # The compare report quotes these snippets: with the rendered prompt every example read as the same system turn.
    assert rows[0]["prompt"] == "What is 2+2?"
    plain = example_outcome_rows(
        [{"example_id": "b", "prompt": "3+4=?", "correct": 0.0}], arm="x", seed=0, step=4, samples_file=None
    )
    assert plain[0]["prompt"] == "3+4=?"
