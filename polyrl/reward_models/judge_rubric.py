"""The judge's rubric: the default templates, the placeholders each mode allows, the rubric's
check, and the rubric filled in with each sample.

A rubric is a ``str.format`` template. Judging one completion at a time it takes ``{prompt}``,
``{completion}``, ``{reference}`` (the first reference), ``{answer}`` (the row's answer field)
and ``{scores}`` (the allowed scores, written out); with ``group: true`` (relative judging) it
takes ``{completions}`` (the prompt's group, numbered), ``{index}`` (the one being scored, from 1)
and ``{n}`` instead of ``{completion}``.
"""

from __future__ import annotations

import string
from typing import Sequence

from polyrl.reward_models.reading import groups_of, numbered
from polyrl.rewards.base import RewardBatch, RewardConfigError

__all__ = [
    "DEFAULT_GROUP_RUBRIC",
    "DEFAULT_RUBRIC",
    "GROUP_FIELDS",
    "SINGLE_FIELDS",
    "checked_rubric",
    "filled_rubrics",
    "score_text",
    "scores_text",
    "template_fields",
]

RUBRIC_FIELD = "judge params.rubric"

DEFAULT_RUBRIC = (
    "Rate how well the answer responds to the request. 1 means wrong or off-topic, 5 means correct, "
    "complete and clear.\n\nRequest: {prompt}\n\nAnswer: {completion}\n\nReply with one number: {scores}."
)
DEFAULT_GROUP_RUBRIC = (
    "Here are {n} answers to the same request.\n\nRequest: {prompt}\n\n{completions}\n\nCompared with the "
    "other answers, how good is answer {index}? 1 means the worst, 5 the best. Reply with one number: {scores}."
)
SINGLE_FIELDS = {"prompt", "completion", "reference", "answer", "scores"}
GROUP_FIELDS = {"prompt", "completions", "index", "n", "reference", "answer", "scores"}


def template_fields(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:  # an unmatched brace
        raise RewardConfigError(f"{RUBRIC_FIELD}: not a valid template ({error}); write a literal brace as {{{{ }}}}") from None


def checked_rubric(rubric: str | None, group: bool) -> str:
    """The rubric a judge uses (the default of its mode when ``rubric`` is None), refused when it
    names a placeholder its mode does not fill or leaves out the one the sample goes in."""
    rubric = rubric if rubric is not None else (DEFAULT_GROUP_RUBRIC if group else DEFAULT_RUBRIC)
    fields = template_fields(rubric)
    allowed = GROUP_FIELDS if group else SINGLE_FIELDS
    needed = {"completions", "index"} if group else {"completion"}
    if fields - allowed:
        raise RewardConfigError(
            f"{RUBRIC_FIELD}: unknown placeholder(s) {sorted(fields - allowed)}; allowed "
            f"{'with group: true' if group else ''}: {', '.join(sorted(allowed))}"
        )
    if needed - fields:
        raise RewardConfigError(f"{RUBRIC_FIELD}: must contain {', '.join('{' + f + '}' for f in sorted(needed))}")
    return rubric


def score_text(score: float) -> str:
    """A score as the judge writes it (``4``, not ``4.0``)."""
    return str(int(score)) if float(score).is_integer() else str(score)


def scores_text(scores: Sequence[float]) -> str:
    """The allowed scores written out for ``{scores}``: ``1, 2, 3, 4 or 5``."""
    texts = [score_text(s) for s in scores]
    return ", ".join(texts[:-1]) + " or " + texts[-1]


def filled_rubrics(rubric: str, batch: RewardBatch, *, group: bool, reference_field: str, scores: Sequence[float]) -> list[str]:
    """The rubric filled in for each sample of ``batch`` (with ``group``, each with its prompt's
    consecutive samples listed)."""
    common = lambda i: {  # noqa: E731
        "prompt": batch.prompts[i],
        "reference": batch.references[i][0] if batch.references[i] else "",
        "answer": "" if batch.fields[i].get(reference_field) is None else str(batch.fields[i][reference_field]),
        "scores": scores_text(scores),
    }
    texts: list[str] = [""] * len(batch)
    if group:
        for members in groups_of(batch.prompts):
            listing = numbered([batch.completions[i] for i in members])
            for k, i in enumerate(members, start=1):
                texts[i] = rubric.format(**common(i), completions=listing, index=k, n=len(members))
    else:
        for i in range(len(batch)):
            texts[i] = rubric.format(**common(i), completion=batch.completions[i])
    return texts
