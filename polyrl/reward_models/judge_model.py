"""The judge's model: its ``params.model`` checked when the judge is built, and resolved to a
model folder when it starts.

A judge model is a Hugging Face folder, a ``.gguf`` file (converted once, as a policy's) or the
name of a built-in pretrained model (``smollm2-135m-instruct``); every error names the judge's own
field, ``judge params.model``, not the policy's ``model.builtin.name``.
"""

from __future__ import annotations

from pathlib import Path

from polyrl.rewards.base import RewardConfigError

__all__ = ["MODEL_FIELD", "check_model_reference", "resolve_model"]

MODEL_FIELD = "judge params.model"


def check_model_reference(model: str) -> None:
    """Refuse a ``params.model`` that is neither a path that exists, a ``.gguf`` path (checked when
    the judge starts) nor a built-in pretrained model's name, under the judge's own field: a
    mistyped folder used to be reported as an unknown ``model.builtin.name``."""
    from polyrl.policies.pretrained import PRETRAINED, is_gguf_path

    if is_gguf_path(model) or Path(model).expanduser().exists() or model in PRETRAINED:
        return
    raise RewardConfigError(
        f"{MODEL_FIELD}: {model!r} is no folder or file that exists, nor a built-in pretrained model; "
        f"allowed: a Hugging Face model folder, a .gguf file, or one of {', '.join(PRETRAINED)}"
    )


def resolve_model(model: str) -> Path:
    """A judge model: a Hugging Face folder, a ``.gguf`` file (converted once, as a policy's), or
    the name of a built-in pretrained model (``smollm2-135m-instruct``)."""
    from polyrl.policies.paths import check_model_dir
    from polyrl.policies.pretrained import MissingPackageError, converted_gguf_dir, is_gguf_path, pretrained_dir

    field = MODEL_FIELD
    if is_gguf_path(model):
        return converted_gguf_dir(model, field=field)
    if Path(model).expanduser().exists():
        return check_model_dir(Path(model).expanduser(), field=field)
    check_model_reference(model)
    try:
        return pretrained_dir(model)
    except MissingPackageError as error:  # its message names the policy's field, model.builtin.name
        raise MissingPackageError(str(error).replace("model.builtin.name", field, 1)) from None
