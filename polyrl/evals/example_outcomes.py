"""Every evaluation's per-example outcomes, as one small JSONL artifact in the evaluated run.

One row per completion: which held-out example it answered (``example_id``), the arm, seed and
step of the checkpoint, whether it was correct, its score, its length in tokens, and where its
full text is (``sample_ref``: the evaluation's sample table and row). ``polyrl compare`` pairs
arms by example within each seed from these rows (:mod:`polyrl.analysis.per_example`).

Periodic evaluation writes ``eval_examples/<suite>/step_<n>.jsonl`` in the seed's (or arm's) run
at every evaluated step; ``polyrl eval`` writes the same file in its eval run and, when it
evaluated a training run's checkpoint, ``eval_examples/<suite>/step_<n>.polyrl-eval.jsonl`` in
that training run. The rows leave the prompt out but for a short snippet, so the file stays
small (docs/evaluation.md gives its size).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from polyrl.data.splits import sample_key

EXAMPLES_FOLDER = "eval_examples"
# The periodic evaluation's sample table, which the training loop's hook logs at each evaluated
# step (polyrl/trainer/hooks.py, PeriodicEvalHook); the rows' sample_ref point into it.
PERIODIC_SAMPLES_FILE = "eval_samples/step_{step:05d}.json"
POLYRL_EVAL_SUFFIX = ".polyrl-eval"  # the file polyrl eval leaves in the training run it evaluated
PROMPT_SNIPPET = 120  # characters of the prompt kept in each row (the comparison report quotes them)
ID_FIELD = "id"


def example_id(sample: Any) -> str:
    """A held-out row's stable id: its dataset's ``id`` column where it has one, else a hash of
    what the model sees (prompt text and image pixels; :func:`polyrl.data.splits.sample_key`),
    so the same question gets the same id in every run, whatever the row order or limit. Two
    rows with the same prompt and images share an id (they are the same question)."""
    value = sample.fields.get(ID_FIELD)
    if value is not None and str(value) != "":
        return str(value)
    return "sha256:" + sample_key(sample).hex()[:16]


def examples_artifact(suite: str, step: int, *, suffix: str = "") -> str:
    """``eval_examples/<suite>/step_<n>[suffix].jsonl`` (the step zero-padded, so files sort by step)."""
    from polyrl.evals.models import slugify

    return f"{EXAMPLES_FOLDER}/{slugify(suite)}/step_{step:05d}{suffix}.jsonl"


def _score(row: dict[str, Any]) -> float | None:
    """The row's score: 1/0 where the suite has an accuracy verdict, else its reward total."""
    if row.get("correct") is not None:
        return 1.0 if row["correct"] > 0 else 0.0
    reward = row.get("reward")
    return None if reward is None else float(reward)


def example_outcome_rows(
    rows: Sequence[dict[str, Any]],
    *,
    arm: str | None,
    seed: int | None,
    step: int,
    samples_file: str | None,
) -> list[dict[str, Any]]:
    """The compact per-completion rows of an evaluation's sample table (``rows``, as
    :class:`polyrl.evals.harness.SuiteRunner` makes them). ``samples_file``: the artifact the
    sample table was logged as (``sample_ref`` is ``<file>#<row index>``); None: none was."""
    out = []
    for index, row in enumerate(rows):
        correct = row.get("correct")
        # The user's text where the row has it: a chat prompt as the model saw it starts with the
        # template's system turn, the same 120 characters for every example.
        prompt = " ".join(str(row.get("question") or row.get("prompt") or "").split())
        out.append(
            {
                "example_id": row.get("example_id", row.get("id")),
                "dataset": row.get("dataset"),
                "sample": row.get("sample_index", 0),
                "arm": arm,
                "seed": seed,
                "step": step,
                "correct": None if correct is None else bool(correct > 0),
                "score": _score(row),
                "length": row.get("length"),
                "finish_reason": row.get("finish_reason"),
                "sample_ref": None if samples_file is None else f"{samples_file}#{index}",
                "prompt": prompt[:PROMPT_SNIPPET],
            }
        )
    return out


def examples_jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)


def example_files(
    result: Any, *, arm: str | None, seed: int | None, step: int, samples_file: str | None, suffix: str = ""
) -> dict[str, str]:
    """The artifact of one evaluation (an :class:`~polyrl.evals.harness.EvalResult`): its file
    name and JSONL text; nothing when the evaluation has no rows."""
    if not result.rows:
        return {}
    rows = example_outcome_rows(result.rows, arm=arm, seed=seed, step=step, samples_file=samples_file)
    return {examples_artifact(result.suite, step, suffix=suffix): examples_jsonl(rows)}
