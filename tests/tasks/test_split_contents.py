"""Held-out data is held out: for every shipped task, no test row repeats a train row's content.

Ids and seeds are not enough (the scenes splits were disjoint by seed while 28 of the 100 test
scenes showed exactly a train scene's image), so these tests read the shipped files and compare
what a model sees: the prompt text, and for image tasks the decoded pixels.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from polyrl.tasks import arithmetic, drawing, scenes, word_problems


@pytest.mark.parametrize("task", [arithmetic, drawing, word_problems], ids=["arithmetic", "drawing", "word_problems"])
def test_text_tasks_share_no_prompt_between_train_and_test(task):
    train = {row["prompt"] for row in task.SHIPPED.read("train")}
    test = {row["prompt"] for row in task.SHIPPED.read("test")}
    assert train and test and not train & test


def test_word_problems_share_no_computation_between_train_and_test():
    # The same kind and numbers under another name or object is the same problem: held out means
    # no test skeleton is a train skeleton, and the shipped files are what the generator makes.
    rows = {split: word_problems.SHIPPED.read(split) for split in ("train", "test")}
    train, test = ({row["skeleton"] for row in rows[split]} for split in ("train", "test"))
    assert len(train) == 2000 and len(test) == 200 and not train & test
    assert rows["test"] == word_problems.make_word_problem_rows(200, seed=word_problems.SHIPPED_SEED, split="test")
    # Every kind is in both splits, and every stored answer is its worked solution's last number.
    assert {r["kind"] for r in rows["test"]} == {k.name for k in word_problems.KINDS} == {r["kind"] for r in rows["train"]}
    assert all(r["solution"].endswith(f"Answer: {r['answer']}") for r in rows["train"] + rows["test"])
    one_step = sum(r["kind"] in ("buy", "give") for r in rows["train"]) / len(rows["train"])
    assert 0.5 < one_step < 0.65  # ONE_STEP_SHARE = 0.6, less the one-step skeletons drawn twice and redrawn


def test_a_word_problem_is_computed_as_its_text_says():
    kinds = {k.name: k for k in word_problems.KINDS}
    assert kinds["buy"].solve(14, 9, 0) == (23, "14 + 9 = 23.") and kinds["give"].solve(14, 9, 0)[0] == 5
    # 14 + 9 − 6 = 17; 20 − 5 + 3 = 18; 3 × 4 − 2 = 10; 22 + 12 + 16 = 50; 7 + (7 + 5) = 19.
    assert kinds["buy_give"].solve(14, 9, 6)[0] == 17
    assert kinds["give_find"].solve(20, 5, 3)[0] == 18
    assert kinds["bags"].solve(3, 4, 2) == (10, "3 x 4 = 12. 12 - 2 = 10.")
    assert kinds["three_adds"].solve(22, 12, 16)[0] == 50
    assert kinds["more_than"].solve(7, 5, 0)[0] == 19


def _pixels(path) -> list[bytes]:
    """Each row's decoded image (RGB bytes, so two encodings of one picture compare equal)."""
    rows = datasets.load_dataset("parquet", data_files={"x": str(path)}, split="x")
    return [np.asarray(row["images"][0].convert("RGB")).tobytes() for row in rows]


def test_scenes_vqa_and_caption_test_images_are_never_train_images():
    train = set(_pixels(scenes.shipped_path("train"))) | set(_pixels(scenes.caption_path("train")))
    test_vqa, test_captions = _pixels(scenes.shipped_path("test")), _pixels(scenes.caption_path("test"))
    assert len(train) > 200 and len(set(test_captions)) > 50
    assert not train & set(test_vqa) and not train & set(test_captions)


def test_scenes_test_vqa_rows_repeat_no_train_row():
    def rows(split):
        data = datasets.load_dataset("parquet", data_files={split: str(scenes.shipped_path(split))}, split=split)
        return {(np.asarray(r["images"][0].convert("RGB")).tobytes(), r["prompt"], r["answer"]) for r in data}

    assert not rows("train") & rows("test")


def test_scene_split_follows_content_and_is_stratified_by_object_count():
    same = (scenes.SceneObject("red", "circle", 0),)
    assert scenes.scene_split(scenes.Scene(seed=1, objects=same)) == scenes.scene_split(scenes.Scene(seed=999, objects=same))
    # One in TEST_BUCKETS = 5 of each object count: round(48/5) = 10, round(864/5) = 173, round(6912/5) = 1382.
    by_count: dict[int, int] = {}
    for key in scenes.test_scene_keys():
        by_count[key.count(";") + 1] = by_count.get(key.count(";") + 1, 0) + 1
    assert by_count == {1: 10, 2: 173, 3: 1382}
