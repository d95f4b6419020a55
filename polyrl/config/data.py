"""``data:``: where the prompts come from and which fields of a row hold what."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.base import StrictModel


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
