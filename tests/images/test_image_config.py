"""``data.images_field``: the image column is whatever the experiment names, end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polyrl.config.schema import resolve_arms
from polyrl.data.prompts import DataConfigError
from polyrl.tasks import scenes
from polyrl.trainer.build_arm import build_arm


def _config(tmp_path, vlm_dir, data: dict) -> dict:
    return {
        "name": "photo",
        "seed": 0,
        "model": {"path": str(vlm_dir)},
        "data": data,
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 4},
        "rewards": [{"module": "accuracy", "params": {"extract": "full"}}],
        "train": {"steps": 1},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 1},
    }


@pytest.fixture
def photo_data(tmp_path):
    """Two VQA rows whose images sit in a column called ``photo``."""
    (tmp_path / "img").mkdir()
    rows = []
    for seed in (0, 1):
        scenes.render(scenes.make_scene(seed)).save(tmp_path / "img" / f"{seed}.png")
        rows.append({"prompt": "<image>Q: How many shapes are there?\nA:", "answer": "one", "photo": [f"img/{seed}.png"]})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_configured_image_column_reaches_the_prompts_and_the_rollout(tmp_path, vlm_dir, photo_data):
    config = resolve_arms(_config(tmp_path, vlm_dir, {"source": str(photo_data), "images_field": "photo"}))["main"]
    arm = build_arm(config, arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        samples = sorted(arm.sampler.samples, key=lambda s: str(s.images[0].size) + s.prompt)
        assert all(len(s.images) == 1 and "photo" not in s.fields for s in arm.sampler.samples)
        expected = {np.asarray(scenes.render(scenes.make_scene(seed))).tobytes() for seed in (0, 1)}
        assert {np.asarray(s.images[0]).tobytes() for s in samples} == expected
        collected = arm.collector.collect(1)
        assert all(c.image_inputs for c in collected.rollout.completions)  # the engine saw pixels, not text only
    finally:
        arm.close()


def test_without_the_setting_the_column_is_not_read_and_the_row_is_refused(tmp_path, vlm_dir, photo_data):
    """The default column ``images`` is absent, so each ``<image>`` has no image: refused, row and field named."""
    config = resolve_arms(_config(tmp_path, vlm_dir, {"source": str(photo_data)}))["main"]
    with pytest.raises(DataConfigError, match=r"row 0.*'images' has 0 image\(s\)"):
        build_arm(config, arm="main", arm_dir=tmp_path / "runs" / "main")
