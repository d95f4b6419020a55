"""``data:``: where the prompts come from and which fields of a row hold what."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.base import StrictModel, check_safe_name


def schedule_value(points: dict[int, float], step: float) -> float:
    """A piecewise-linear schedule ``{step: value}`` at ``step``: linear between the given steps,
    the first value before the first and the last value after the last."""
    steps = sorted(points)
    if step <= steps[0]:
        return float(points[steps[0]])
    for left, right in zip(steps, steps[1:]):
        if step <= right:
            share = (step - left) / (right - left)
            return float(points[left] + share * (points[right] - points[left]))
    return float(points[steps[-1]])


def default_source_name(source: str) -> str:
    """A mixture source's name in metrics when it sets none: a reasoning-gym task's name, a
    file's stem, else the source with every character a metric name cannot hold as '-'."""
    if source.startswith("reasoning_gym:"):
        source = source[len("reasoning_gym:") :].partition("?")[0]
    elif source.endswith((".jsonl", ".json", ".parquet")):
        source = Path(source).stem
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", source).strip("-") or "source"


class MixtureSourceConfig(StrictModel):
    """One source of a data mixture (``data.sources``): where its rows come from and its weight."""

    source: str = Field(..., min_length=1, description="A data source, as data.source takes (reasoning_gym:<task> too).")
    weight: float | dict[int, float] = Field(
        1.0,
        description="Its share of each step's prompts, relative to the other sources' weights: a number, or a "
        "piecewise-linear schedule over training steps ({0: 1.0, 100: 0.2}: 1.0 at step 0, 0.2 from step 100 on).",
    )
    name: str | None = Field(
        None,
        description="Its name in the per-source metrics (train/source/<name>/accuracy); default: the reasoning-gym "
        "task, the file's stem, or the source.",
    )

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: float | dict[int, float]) -> float | dict[int, float]:
        values = [value] if not isinstance(value, dict) else list(value.values())
        if isinstance(value, dict):
            if not value:
                raise ValueError("a weight schedule needs at least one {step: weight} point")
            if any(step < 0 for step in value):
                raise ValueError(f"schedule steps must be >= 0, got {sorted(value)}")
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError(f"weights must be finite and >= 0, got {value}")
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        return None if value is None else check_safe_name(value, "it names the source's metrics")

    @property
    def label(self) -> str:
        return self.name or default_source_name(self.source)

    def weight_at(self, step: float) -> float:
        return float(self.weight) if not isinstance(self.weight, dict) else schedule_value(self.weight, step)

    @property
    def scheduled(self) -> bool:
        return isinstance(self.weight, dict) and len(set(self.weight.values())) > 1


class DataConfig(StrictModel):
    """The training prompts: where they come from, which split, and which columns of a row hold the prompt,
    answer, references, images and chat messages."""

    source: str = Field(
        "arithmetic", description="'arithmetic' (shipped), a .jsonl/.json/.parquet path, a folder, or a dataset name."
    )
    train_split: str = Field(
        "train",
        description="The split training draws from. A single file is the split its name declares "
        "(rows.test.jsonl), else 'train'; another split is refused (polyrl/data/splits.py).",
    )
    holdout: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Split a single local file by a fixed hash of each row: this "
        "fraction is 'test', the rest 'train' (an eval dataset with the same holdout and split: test "
        "reads the other rows).",
    )
    prompt_field: str = Field(
        "prompt",
        description="The column of each row's prompt text; a row without it but with messages_field is a chat row. "
        "Every other column (except references and images) reaches the reward modules as the sample's fields.",
    )
    answer_field: str = Field(
        "answer",
        description="The column of each row's gold answer: the references when the row has no references_field, and "
        "the answer the sample tables show.",
    )
    references_field: str = Field(
        "references",
        description="The column of each row's reference texts (a string or a list; for rewards that compare with "
        "references); absent: [answer], else none.",
    )
    images_field: str = Field(
        "images",
        description="The column of each row's images (paths, or an Image feature); "
        "rows without it are text-only. One <image> in the prompt per image.",
    )
    limit: int | None = Field(
        None, ge=1, description="Train on the first N rows of the training split only (after holdout); default: all rows."
    )
    # Pillow's own default (Image.MAX_IMAGE_PIXELS, polyrl.data.image_rows.DEFAULT_MAX_IMAGE_PIXELS).
    max_image_pixels: int = Field(
        89_478_485,
        ge=1,
        description="Refuse an image of more pixels (width × height) than this, "
        "read from its header before decoding, naming the row, the file and this limit. Default: "
        "Pillow's own limit, ~89.5 megapixels (9459×9459).",
    )
    chat_template: bool | None = Field(
        None,
        description="Format each prompt through the tokenizer's chat template (a user message, generation prompt "
        "appended), once, for the sampler, the learner and periodic eval alike; refused for a tokenizer without one. "
        "Default: on when the rows carry messages_field, else off.",
    )
    system_prompt: str | None = Field(None, description="A system message before every prompt (chat formatting only).")
    messages_field: str = Field(
        "messages",
        description="The column of chat rows: a list of {role, content} messages "
        "ending with the user's turn; it may stand in for prompt_field.",
    )
    sources: list[MixtureSourceConfig] | None = Field(
        None,
        min_length=1,
        description="A data mixture instead of data.source: each step's prompts drawn from these sources by weight "
        "(polyrl/data/mixtures.py), with per-source metrics; the other data settings (split, fields, limit, holdout) "
        "apply to each source. Refused together with data.source.",
    )

    @model_validator(mode="after")
    def _mixture(self) -> "DataConfig":
        if self.sources is None:
            return self
        if "source" in self.model_fields_set:
            raise _field_error(
                ("sources",), "data.source and data.sources are exclusive: one source, or a mixture; remove one", self.source
            )
        labels = [s.label for s in self.sources]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise _field_error(("sources",), f"sources named {repeated} more than once; set sources[i].name", labels)
        # The total weight is piecewise linear between the schedules' points: positive at each
        # point (and at the constant ends) means positive at every step.
        points = sorted({0, *(step for s in self.sources if isinstance(s.weight, dict) for step in s.weight)})
        for step in points:
            if sum(s.weight_at(step) for s in self.sources) <= 0:
                raise _field_error(("sources",), f"every source's weight is 0 at step {step}: no source to draw from", labels)
        return self

    def source_labels(self) -> list[str]:
        """The names of the mixture's sources (empty without data.sources)."""
        return [s.label for s in self.sources or []]

    @model_validator(mode="before")
    @classmethod
    def _no_test_split(cls, data: Any) -> Any:
        # data.test_split used to be accepted and logged but was never read: held-out
        # evaluation takes its rows from the eval suite (eval.suite: datasets[].split).
        if isinstance(data, dict) and "test_split" in data:
            detail = InitErrorDetails(
                type=PydanticCustomError(
                    "value_error",
                    "data.test_split is not read by anything: held-out evaluation takes its split from the eval suite "
                    "(eval.suite, each dataset's split); remove it",
                ),
                loc=("test_split",),
                input=data["test_split"],
            )
            raise ValidationError.from_exception_data("DataConfig", [detail])
        return data


def _field_error(loc: tuple[Any, ...], message: str, value: Any) -> ValidationError:
    detail = InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=value)
    return ValidationError.from_exception_data("DataConfig", [detail])
