"""The synthetic scene generator: determinism, pixels where the objects are, unique answers, shipped data."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from polyrl.tasks import scenes


def test_scene_is_a_pure_function_of_its_seed():
    assert scenes.make_scene(7) == scenes.make_scene(7)
    assert np.array_equal(np.asarray(scenes.render(scenes.make_scene(7))), np.asarray(scenes.render(scenes.make_scene(7))))
    assert len({scenes.make_scene(s) for s in range(50)}) > 30  # seeds give varied scenes


def test_render_puts_the_colour_in_the_objects_cell_and_background_elsewhere():
    scene = scenes.Scene(seed=-1, objects=(scenes.SceneObject("red", "square", 1),))  # top right
    pixels = np.asarray(scenes.render(scene))
    assert pixels.shape == (32, 32, 3)
    # Cell 1 spans rows 0-15, columns 16-31; its centre (8, 24) is red, cell 0's centre is background.
    assert tuple(pixels[8, 24]) == scenes.COLORS["red"]
    assert tuple(pixels[8, 8]) == scenes.BACKGROUND
    assert tuple(pixels[24, 24]) == scenes.BACKGROUND


def test_questions_have_the_scene_answers_and_are_asked_only_when_unique():
    scene = scenes.Scene(
        seed=-1,
        objects=(
            scenes.SceneObject("red", "circle", 0),
            scenes.SceneObject("blue", "circle", 2),
            scenes.SceneObject("green", "square", 3),
        ),
    )
    qa = {(q["kind"], q["question"]): q["answer"] for q in scenes.questions(scene)}
    # Two circles: no "What color is the circle?"; one square: its colour is asked.
    assert ("color", "What color is the circle?") not in qa
    assert qa[("color", "What color is the square?")] == "green"
    assert qa[("shape", "What shape is at bottom left?")] == "circle"
    assert qa[("position", "Where is the red circle?")] == "top left"
    assert qa[("count", "How many shapes are there?")] == "3"
    assert len(qa) == 1 + 3 + 3 + 1  # colour of the square, 3 shapes, 3 positions, count
    caps = scenes.captions(scene)
    assert caps[0] == "a red circle at top left, a blue circle at bottom left and a green square at bottom right"
    assert len(set(caps)) == 4


def test_answer_matching_takes_the_first_line_trimmed():
    assert scenes.answer_matches(" Red\nQ: more", "red")
    assert scenes.answer_matches(" top left.", "top left")
    assert not scenes.answer_matches(" reddish", "red")
    assert not scenes.answer_matches("", "red")


@pytest.mark.parametrize("split", scenes.SPLITS)
def test_shipped_parquet_equals_the_generator(split):
    shipped = datasets.load_dataset("parquet", data_files={split: str(scenes.shipped_path(split))}, split=split)
    rows = scenes.split_rows(split)
    assert len(shipped) == len(rows)
    for index in (0, len(rows) // 2, len(rows) - 1):
        got, want = shipped[index], rows[index]
        assert {k: got[k] for k in ("prompt", "answer", "kind", "scene_id", "references")} == {
            k: want[k] for k in ("prompt", "answer", "kind", "scene_id", "references")
        }
        image = got["images"][0]
        assert image.size == (32, 32)
        assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(scenes.render(scenes.make_scene(want["scene_id"]))))


def test_splits_share_no_scene():
    train = {r["scene_id"] for r in scenes.split_rows("train")}
    test = {r["scene_id"] for r in scenes.split_rows("test")}
    assert train and test and not train & test
