"""Images of prompt rows: what a row may hold, how it is checked, how it becomes PIL images.

A prompt row carries its images in one column (``data.images_field``, default ``images``):

* a list of images, or a single image; each image is
* a path string (in a ``.jsonl``/``.json`` file; relative paths are relative to the data file's
  folder), or
* what ``datasets`` gives for an ``Image`` feature: a PIL image when decoded, a
  ``{"bytes": ..., "path": ...}`` dict when not (a parquet image column).

The prompt marks where each image goes with one ``<image>`` placeholder per image, in order
(the Idefics3 convention, which polyrl uses for every model; an engine maps it to the model's
own image token). Every row is checked when the data is loaded, before any model is built:
a missing or unreadable image file, a value of the wrong type, or a placeholder count that
differs from the image count is a ``DataConfigError`` naming the row and the field.

An image larger than ``data.max_image_pixels`` (default: Pillow's own limit,
:data:`DEFAULT_MAX_IMAGE_PIXELS`) is refused from its header, before any pixel is decoded,
naming the row, the file and the limit; Pillow's ``DecompressionBombError`` never reaches the
user.
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from PIL import Image, UnidentifiedImageError

from polyrl.data.errors import DataConfigError

IMAGE_PLACEHOLDER = "<image>"
# Pillow's default Image.MAX_IMAGE_PIXELS (1 GiB of 24-bit pixels / 4 / 3, ~9459×9459): above it
# Pillow warns, above twice it refuses with DecompressionBombError.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


@dataclass
class ImageCheck:
    """How data rows' images are checked (``max_pixels``; ``decode``: decode every image, not only
    verify its file) and what the check saw (``rows`` with images, ``images``)."""

    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    decode: bool = False
    rows: int = 0
    images: int = 0


def _where(index: int, field: str, position: int | None) -> str:
    return f"row {index}: field {field!r}" + ("" if position is None else f"[{position}]")


def image_values(row: Mapping[str, Any], field: str, *, index: int) -> list[Any]:
    """The row's image values as a list (``[]`` when the column is absent or null)."""
    value = row.get(field)
    if value is None:
        return []
    if isinstance(value, (str, bytes, dict, Image.Image)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise DataConfigError(
        f"{_where(index, field, None)}: must be an image (a path, image bytes or a decoded image) or a list of them, "
        f"got {type(value).__name__}"
    )


def open_image(
    value: Any,
    *,
    index: int,
    field: str,
    position: int,
    base_dir: Path | None = None,
    decode: bool = True,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> Image.Image | None:
    """One image value -> an RGB PIL image (``decode=False``: only check it, return ``None``);
    one of more than ``max_pixels`` pixels is refused."""
    where = _where(index, field, position)
    if isinstance(value, Image.Image):
        _check_size(value.size, "image", where, max_pixels)
    if isinstance(value, Image.Image):
        return value.convert("RGB") if decode else None
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            source: Any = io.BytesIO(value["bytes"])
            name = "image bytes"
        elif value.get("path"):
            value = value["path"]
            source = name = None
        else:
            raise DataConfigError(f"{where}: image has neither bytes nor a path")
        if source is not None:
            return _decode(source, name, where, decode, max_pixels)
    if isinstance(value, bytes):
        return _decode(io.BytesIO(value), "image bytes", where, decode, max_pixels)
    if isinstance(value, str):
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise DataConfigError(f"{where}: image file {value!r} not found ({path.resolve()})")
        return _decode(path, f"image file {value!r}", where, decode, max_pixels)
    raise DataConfigError(f"{where}: must be an image path, image bytes or a decoded image, got {type(value).__name__}")


def _check_size(size: tuple[int, int], name: str, where: str, max_pixels: int) -> None:
    width, height = size
    if width * height > max_pixels:
        raise DataConfigError(
            f"{where}: {name} is {width}×{height} = {width * height:,} pixels, above the limit data.max_image_pixels = "
            f"{max_pixels:,}; shrink the image, or raise data.max_image_pixels if it is meant to be this large"
        )


def _decode(source: Any, name: str, where: str, decode: bool, max_pixels: int) -> Image.Image | None:
    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > Image.MAX_IMAGE_PIXELS:
        # Pillow refuses above twice its own limit before the size can be read here; a larger
        # configured limit raises Pillow's (process-wide, never lowered).
        Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked below, naming the row
            with Image.open(source) as image:
                _check_size(image.size, name, where, max_pixels)  # from the header: nothing decoded yet
                if not decode:
                    image.verify()
                    return None
                return image.convert("RGB")
    except Image.DecompressionBombError as error:
        raise DataConfigError(
            f"{where}: {name} is above the limit data.max_image_pixels = {max_pixels:,} ({error}); shrink the image, "
            "or raise data.max_image_pixels if it is meant to be this large"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataConfigError(f"{where}: {name} is not a readable image ({type(error).__name__}: {error})") from None


def check_placeholder_count(prompt: str, num_images: int, *, index: int, prompt_field: str, images_field: str) -> None:
    found = prompt.count(IMAGE_PLACEHOLDER)
    if found != num_images:
        raise DataConfigError(
            f"row {index}: field {prompt_field!r} has {found} {IMAGE_PLACEHOLDER} placeholder(s) but field "
            f"{images_field!r} has {num_images} image(s); put one {IMAGE_PLACEHOLDER} in the prompt per image"
        )


def check_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    prompt_field: str,
    images_field: str,
    base_dir: Path | None,
    check: ImageCheck | None = None,
) -> int:
    """Check every row's images (type, file, size, readable — decoded with ``check.decode`` —, count vs
    placeholders); return how many rows have images (``check`` also counts the images)."""
    check = check or ImageCheck()
    with_images = 0
    for index, row in enumerate(rows):
        values = image_values(row, images_field, index=index)
        for position, value in enumerate(values):
            open_image(
                value,
                index=index,
                field=images_field,
                position=position,
                base_dir=base_dir,
                decode=check.decode,
                max_pixels=check.max_pixels,
            )
        prompt = row.get(prompt_field)
        if isinstance(prompt, str):
            check_placeholder_count(prompt, len(values), index=index, prompt_field=prompt_field, images_field=images_field)
        with_images += bool(values)
        check.images += len(values)
    check.rows += with_images
    return with_images


def model_takes_images(model_dir: str | Path) -> bool:
    """Whether the model folder's config has a vision tower (``vision_config``)."""
    config = Path(model_dir) / "config.json"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(parsed, dict) and parsed.get("vision_config") is not None


def check_model_takes_images(
    model_dir: str | Path, samples: Iterable[Any], *, field: str = "model", images_field: str = "images"
) -> None:
    """A text-only model given image prompts is refused, naming the first such row and its image field."""
    for index, sample in enumerate(samples):
        if getattr(sample, "images", None):
            if not model_takes_images(model_dir):
                raise DataConfigError(
                    f"row {index} has image(s) but {field} {str(model_dir)!r} is a text-only model (its config.json "
                    f"has no vision_config), so it cannot read field {images_field!r}; use an image-text model "
                    "(e.g. model.builtin.task: vqa) or text-only data"
                )
            return
