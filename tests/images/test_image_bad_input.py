"""Bad image input, as a user meets it: ``polyrl run`` / ``polyrl eval`` exit 2 with one message
naming the row and the field, no traceback, and nothing trained or evaluated.

The jsonl forms of each check are unit-tested in test_image_data.py; here: the commands, and the
parquet forms (a ``datasets`` ``Image`` column goes through a different loading path).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from polyrl.data.prompts import DataConfigError, load_prompt_dataset

POLYRL = str(Path(sys.executable).with_name("polyrl"))


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_data(tmp_path: Path, images: list[list[str]]) -> Path:
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "img" / "red.png").write_bytes(png())
    rows = [{"prompt": "<image>Q: What color is it?\nA:", "answer": "red", "images": paths} for paths in images]
    path = tmp_path / "vqa.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def experiment(tmp_path: Path, model: Path, data: Path, write_experiment) -> Path:
    return write_experiment(
        tmp_path,
        {
            "name": "bad_images",
            "seed": 0,
            "model": {"path": str(model)},
            "data": {"source": str(data)},
            "rollout": {"engine": "hf", "prompts_per_step": 1, "samples_per_prompt": 2, "max_tokens": 4},
            "rewards": [{"module": "accuracy", "params": {"extract": "full"}}],
            "train": {"steps": 1},
            "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
            "checkpoint": {"dir": str(tmp_path / "runs"), "every": 1},
        },
    )


def run(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([POLYRL, "run", str(path), "--no-progress"], capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_refused(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


def assert_nothing_trained(tmp_path: Path) -> None:
    assert not list((tmp_path / "runs").rglob("step_*")), "a checkpoint was written"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bad_images")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    assert all("train/step" not in r.data.metrics for r in runs)


def test_run_with_a_missing_image_file_exits_2_naming_the_row_and_field(tmp_path, vlm_dir, write_experiment):
    data = image_data(tmp_path, [["img/red.png"], ["img/missing.png"]])
    done = run(experiment(tmp_path, vlm_dir, data, write_experiment), tmp_path)
    assert_refused(done, "row 1: field 'images'[0]: image file 'img/missing.png' not found")
    assert_nothing_trained(tmp_path)


def test_run_of_a_text_only_model_on_image_prompts_exits_2_naming_the_row_and_field(
    tmp_path, random_policy_dir, write_experiment
):
    data = image_data(tmp_path, [["img/red.png"]])
    done = run(experiment(tmp_path, random_policy_dir, data, write_experiment), tmp_path)
    # Refused by the preflight (from the config and the first row, before any model loads).
    assert_refused(done, "row 0 has image(s) (field 'images') but model.path", "is a text-only model")
    assert_nothing_trained(tmp_path)


def test_eval_of_a_text_only_model_on_an_image_suite_exits_2_before_any_engine(tmp_path, random_policy_dir):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "polyrl.cli.evaluate",
            "--model",
            str(random_policy_dir),
            "--suite",
            "vqa",
            "--limit",
            "2",
            "--engine",
            "hf",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
    )
    assert_refused(done, "dataset 'scenes': row 0 has image(s) but --model", "is a text-only model", "cannot read field 'images'")
    assert not (tmp_path / "out").exists()
    experiment = MlflowClient(uri).get_experiment_by_name("polyrl-eval")
    assert experiment is None or not MlflowClient(uri).search_runs([experiment.experiment_id])


IMAGE_LIST = datasets.Features({"prompt": datasets.Value("string"), "images": datasets.List(datasets.Image())})


@pytest.mark.parametrize("case", ["wrong_type", "unreadable_bytes", "count_mismatch"])
def test_parquet_image_column_problems_name_the_row_and_field(tmp_path, case):
    good = {"bytes": png(), "path": None}
    if case == "wrong_type":
        table = datasets.Dataset.from_dict({"prompt": ["<image>a", "<image>b"], "images": [1, 2]})
        expected = r"row 0: field 'images': must be an image .* got int"
    elif case == "unreadable_bytes":
        table = datasets.Dataset.from_dict(
            {"prompt": ["<image>a", "<image>b"], "images": [[good], [{"bytes": b"not a png", "path": None}]]}, features=IMAGE_LIST
        )
        expected = r"row 1: field 'images'\[0\]: image bytes is not a readable image"
    else:
        table = datasets.Dataset.from_dict(
            {"prompt": ["<image>a", "<image><image>b"], "images": [[good], [good]]}, features=IMAGE_LIST
        )
        expected = r"row 1: field 'prompt' has 2 <image> placeholder\(s\) but field 'images' has 1 image"
    table.to_parquet(str(tmp_path / "data.parquet"))
    with pytest.raises(DataConfigError, match=expected):
        load_prompt_dataset(str(tmp_path / "data.parquet"), "train")
