"""Dataset rows to :class:`~polyrl.core.types.PromptSample`: the prompt (or a chat row's last
user message), the references (the references column, else the answer), the images opened as
RGB pictures, and every other column kept for the reward modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import datasets

from polyrl.core.types import PromptSample
from polyrl.data import chat, image_rows
from polyrl.data.errors import DataConfigError

__all__ = ["rows_to_prompt_samples"]


def _references(row: Mapping[str, Any], answer_field: str, references_field: str) -> list[str]:
    if references_field in row and row[references_field] is not None:
        value = row[references_field]
        if isinstance(value, str):
            return [value]
        if isinstance(value, Iterable):
            return [str(item) for item in value]
        raise DataConfigError(f"references field {references_field!r} must be a string or a list, got {value!r}")
    if answer_field in row and row[answer_field] is not None:
        return [str(row[answer_field])]
    return []


def rows_to_prompt_samples(
    rows: Iterable[Mapping[str, Any]] | datasets.Dataset,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    references_field: str = "references",
    images_field: str = "images",
    max_image_pixels: int = image_rows.DEFAULT_MAX_IMAGE_PIXELS,
    messages_field: str | None = None,
) -> list[PromptSample]:
    """Dataset rows -> ``PromptSample``s.

    A row without ``prompt_field`` but with ``messages_field`` (when given) is a chat row: its
    prompt is its last user message's text (what rewards see), and the messages stay in
    ``fields`` for :func:`polyrl.data.chat.format_prompts`.

    ``references`` is the ``references_field`` list if present, else ``[answer]``, else ``[]``.
    ``images`` are the ``images_field`` values as RGB PIL images (``data/images.py``).
    ``fields`` holds every column except the prompt, references and images (so ``answer`` and
    ``id`` reach reward modules).
    """
    samples = []
    for index, row in enumerate(rows):
        if prompt_field not in row and messages_field is not None and row.get(messages_field) is not None:
            prompt = chat.last_user_text(row[messages_field], index=index, field=messages_field)
        elif prompt_field not in row:
            raise DataConfigError(f"row {index}: prompt field {prompt_field!r} not found; columns are {sorted(row)}")
        else:
            prompt = row[prompt_field]
        if not isinstance(prompt, str):
            raise DataConfigError(f"row {index}: prompt field {prompt_field!r} must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise DataConfigError(f"row {index}: the prompt is empty (field {prompt_field!r}); a row needs a prompt to answer")
        fields = {key: value for key, value in row.items() if key not in (prompt_field, references_field, images_field)}
        values = image_rows.image_values(row, images_field, index=index)
        samples.append(
            PromptSample(
                prompt=prompt,
                references=_references(row, answer_field, references_field),
                images=[
                    image_rows.open_image(v, index=index, field=images_field, position=i, max_pixels=max_image_pixels)
                    for i, v in enumerate(values)
                ],
                fields=fields,
            )
        )
    return samples
