"""Prompt rows with images: jsonl with paths and parquet with an Image column load the same way;
each kind of bad input is refused before training with the row and the field named."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from polyrl.data.image_rows import check_model_takes_images
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import DataConfigError, load_prompt_dataset
from polyrl.tasks import scenes


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def image_files(tmp_path):
    """Two scene PNGs under tmp_path/img/ and their pixels."""
    folder = tmp_path / "img"
    folder.mkdir()
    pixels = []
    for seed in (0, 1):
        image = scenes.render(scenes.make_scene(seed))
        image.save(folder / f"{seed}.png")
        pixels.append(np.asarray(image))
    return folder, pixels


def test_jsonl_with_relative_image_paths_loads_into_prompt_samples(tmp_path, image_files):
    _, pixels = image_files
    data = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": "<image>Q: What shape?\nA:", "answer": "square", "images": ["img/0.png"]},
            {"prompt": "<image><image>Q: Same?\nA:", "answer": "no", "images": ["img/0.png", "img/1.png"]},
            {"prompt": "2+2=", "answer": "4", "images": None},  # text-only row in the same file
        ],
    )
    samples = rows_to_prompt_samples(load_prompt_dataset(str(data), "train"))
    assert [len(s.images) for s in samples] == [1, 2, 0]
    assert np.array_equal(np.asarray(samples[1].images[1]), pixels[1])
    assert samples[0].images[0].mode == "RGB" and "images" not in samples[0].fields
    assert samples[0].references == ["square"]


def test_parquet_with_an_image_column_loads_like_the_shipped_scenes(tmp_path):
    rows = scenes.split_rows("test")[:5]
    path = tmp_path / "vqa.parquet"
    features = datasets.Features(
        {"prompt": datasets.Value("string"), "answer": datasets.Value("string"), "images": datasets.List(datasets.Image())}
    )
    datasets.Dataset.from_list([{k: r[k] for k in ("prompt", "answer", "images")} for r in rows], features=features).to_parquet(
        str(path)
    )
    samples = rows_to_prompt_samples(load_prompt_dataset(str(path), "train"))
    want = np.asarray(scenes.render(scenes.make_scene(rows[0]["scene_id"])))
    assert np.array_equal(np.asarray(samples[0].images[0]), want)
    builtin = rows_to_prompt_samples(load_prompt_dataset("scenes", "test", limit=5))
    assert [s.prompt for s in builtin] == [s.prompt for s in samples]
    assert np.array_equal(np.asarray(builtin[0].images[0]), want)


def test_missing_image_file_names_row_and_field(tmp_path, image_files):
    data = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "<image>a", "images": ["img/0.png"]},
            {"prompt": "<image>b", "images": ["img/nope.png"]},
        ],
    )
    with pytest.raises(DataConfigError, match=r"row 1: field 'images'\[0\]: image file 'img/nope.png' not found"):
        load_prompt_dataset(str(data), "train")


def test_unreadable_image_file_names_row_and_field(tmp_path, image_files):
    folder, _ = image_files
    (folder / "bad.png").write_bytes(b"not a png at all")
    data = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "<image>a", "images": ["img/bad.png"]}])
    with pytest.raises(DataConfigError, match=r"row 0: field 'images'\[0\]: image file 'img/bad.png' is not a readable image"):
        load_prompt_dataset(str(data), "train")


def test_image_column_of_the_wrong_type_is_refused(tmp_path):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "<image>a", "images": 7}])
    with pytest.raises(DataConfigError, match=r"row 0: field 'images': must be an image .* got int"):
        load_prompt_dataset(str(data), "train")
    data = _write_jsonl(tmp_path / "e.jsonl", [{"prompt": "<image>a", "images": [[1, 2]]}])
    with pytest.raises(
        DataConfigError, match=r"row 0: field 'images'\[0\]: must be an image path, image bytes or a decoded image, got list"
    ):
        load_prompt_dataset(str(data), "train")


def test_placeholder_count_must_equal_image_count(tmp_path, image_files):
    data = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "<image>a", "images": ["img/0.png"]},
            {"prompt": "no placeholder", "images": ["img/0.png"]},
        ],
    )
    with pytest.raises(
        DataConfigError, match=r"row 1: field 'prompt' has 0 <image> placeholder\(s\) but field 'images' has 1 image"
    ):
        load_prompt_dataset(str(data), "train")
    data = _write_jsonl(tmp_path / "e.jsonl", [{"prompt": "<image> and no image"}])
    with pytest.raises(DataConfigError, match=r"row 0: field 'prompt' has 1 <image> placeholder\(s\) but field 'images' has 0"):
        load_prompt_dataset(str(data), "train")


def test_text_only_model_given_image_prompts_is_refused(random_policy_dir):
    samples = rows_to_prompt_samples(load_prompt_dataset("scenes", "test", limit=3))
    with pytest.raises(DataConfigError, match=r"row 0 has image\(s\) but model .* is a text-only model"):
        check_model_takes_images(random_policy_dir, samples)
    text = rows_to_prompt_samples(load_prompt_dataset("arithmetic", "test", limit=3))
    check_model_takes_images(random_policy_dir, text)  # text prompts on a text model: fine
