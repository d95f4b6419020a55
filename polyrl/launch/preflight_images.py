"""Pre-flight checks of images: image data for a text-only policy, ``train.padding_free`` with an
image-text policy, and every image of the rows an arm trains on opened and decoded.

The last reads every row: a local data file with an image column has each image of the rows
an arm trains on (``data.limit``, ``data.holdout``) opened and decoded, and its size held
against ``data.max_image_pixels``, once per distinct data setting, and how many images that was
and how long it took is said. It costs what the arm's own data load costs (that load decodes
every image too, :class:`polyrl.data.sampler.PromptSampler`), and spares a run that would fail
on row 9,000 after its MLflow runs exist and its policy has loaded.
"""

from __future__ import annotations

import time
from pathlib import Path

from polyrl.config.schema import ExperimentConfig
from polyrl.data.image_rows import ImageCheck
from polyrl.data.prompts import BUILTIN_SOURCES, DataConfigError, load_prompt_dataset, may_have_images, source_has_images
from polyrl.engines.image_prompts import model_takes_images
from polyrl.policies.pretrained import is_gguf_path

__all__ = ["IMAGE_TASKS", "ImageRows", "image_check_lines", "image_problems", "image_row_problem", "padding_free_problems"]

# Built-in policies that read images (config.schema.BuiltinModelConfig.task).
IMAGE_TASKS = ("vqa", "caption")


def padding_free_problems(config: ExperimentConfig) -> list[str]:
    """``train.padding_free: true`` with an image-text policy: refused by the run when the policy
    loads (polyrl/modeling/packing.py), here before."""
    if config.train.padding_free is not True:
        return []
    model = config.model
    if model.path and not is_gguf_path(model.path):
        images = Path(model.path, "config.json").is_file() and model_takes_images(model.path)
        policy = f"model.path {model.path!r} is an image-text model (its config.json has a vision_config)"
    else:
        images = not model.path and model.builtin.name is None and model.builtin.task in IMAGE_TASKS
        policy = f"model.builtin.task {model.builtin.task!r} is an image-text policy"
    if not images:
        return []
    return [
        f"train.padding_free: true, but {policy}; padding-free rows are for text policies only (image features are "
        "placed by padded rows); allowed here: padding_free: false or auto"
    ]


def image_problems(config: ExperimentConfig) -> list[str]:
    """Image data for a text-only policy, found before any model loads (the full per-row check
    runs when the data loads)."""
    data, model = config.data, config.model
    if not source_has_images(data.source, data.train_split, images_field=data.images_field):
        return []
    if model.path and is_gguf_path(model.path):
        policy = f"model.path {model.path!r} is a GGUF causal LM, a text-only model"
    elif model.path:
        if not Path(model.path, "config.json").is_file() or model_takes_images(model.path):
            return []
        policy = f"model.path {model.path!r} is a text-only model (its config.json has no vision_config)"
    elif model.builtin.name is not None:
        policy = f"model.builtin.name {model.builtin.name!r} is a text-only policy"
    elif model.builtin.task in IMAGE_TASKS:
        return []
    else:
        policy = f"model.builtin.task {model.builtin.task!r} is a text-only policy"
    rows = "its rows have" if data.source in BUILTIN_SOURCES else "row 0 has"
    return [
        f"data.source {data.source!r}: {rows} image(s) (field {data.images_field!r}) but {policy}; use an image-text model "
        f"(model.builtin.task: {' or '.join(IMAGE_TASKS)}, or an image-text model.path) or text-only data"
    ]


ImageRows = dict[tuple, tuple[str | None, ImageCheck, float]]  # data settings -> (problem, what was checked, seconds)


def image_row_problem(config: ExperimentConfig, checked: ImageRows) -> str | None:
    """Open and decode every image of the rows the arm trains on (once per distinct data setting)."""
    data = config.data
    if not may_have_images(data.source, data.train_split, images_field=data.images_field):
        return None
    key = (data.source, data.train_split, data.prompt_field, data.images_field, data.limit, data.holdout, data.max_image_pixels)
    if key not in checked:
        check, started, problem = ImageCheck(max_pixels=data.max_image_pixels, decode=True), time.perf_counter(), None
        try:
            load_prompt_dataset(
                data.source,
                data.train_split,
                prompt_field=data.prompt_field,
                answer_field=data.answer_field,
                references_field=data.references_field,
                images_field=data.images_field,
                limit=data.limit,
                holdout=data.holdout,
                images=check,
            )
        except DataConfigError as error:
            problem = f"data.source: {error}"
        checked[key] = (problem, check, time.perf_counter() - started)
    return checked[key][0]


def image_check_lines(checked: ImageRows) -> list[str]:
    return [
        f"images: {check.images:,} in {check.rows:,} rows of {source!r} found, decoded and within data.max_image_pixels "
        f"({max_pixels:,}) in {seconds:.1f} s"
        for (source, *_, max_pixels), (_, check, seconds) in checked.items()
        if check.images
    ]
