"""``polyrl eval`` on a vision-language model: the tiny Idefics3's folder and a checkpoint of a
VLM training run, on the shipped VQA suite (experiments/evals/vqa.yaml), through vLLM (CPU).

One training run (1 step, HF engine, in this process: the CLI's own run is tested elsewhere) gives
the checkpoint; one eval command evaluates both models, as a user runs it, in a subprocess.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

pytest.importorskip("vllm")

from polyrl.evals import SuiteRunner  # noqa: E402
from polyrl.tasks import scenes  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LIMIT = 6
DATA_URI = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    """The tiny VLM after 40 warm-up steps (as tests/images/conftest.py builds it)."""
    from polyrl.policies.vlm import warm_vlm_policy

    return warm_vlm_policy(tmp_path_factory.mktemp("vlm_cache"), steps=40, eval_prompts=16)


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory, vlm_dir):
    """A one-step GRPO run of the VLM on scenes VQA: (tracking uri, run id, folder)."""
    import yaml

    folder = tmp_path_factory.mktemp("vlm_run")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    (folder / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "vqa_eval_src",
                "seed": 0,
                "model": {"path": str(vlm_dir)},
                "data": {"source": "scenes", "limit": 32},
                "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
                "rewards": [
                    {"module": "accuracy", "params": {"extract": "full"}},
                    {"module": "length", "weight": 0.01, "params": {"unit": "chars"}},
                ],
                "train": {"steps": 1, "learning_rate": 1e-3, "micro_batch_size": 8},
                "tracking": {"uri": uri, "progress": False, "sample_table_every": 1, "sample_table_rows": 5},
                "checkpoint": {"dir": str(folder / "runs"), "every": 1},
            }
        )
    )
    from polyrl.launch.runner import run_experiment

    result = run_experiment(folder / "exp.yaml", show_progress=False)
    assert not result.failed and result.final_metrics["main"], result
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vqa_eval_src")
    (arm,) = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("polyrl.role") == "arm"]
    return uri, arm.info.run_id, folder


def html_images(text: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(match))) for match in DATA_URI.findall(text)]


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


def test_training_run_logs_its_image_samples_as_html(vlm_run):
    uri, run_id, folder = vlm_run
    client = MlflowClient(uri)
    text = Path(client.download_artifacts(run_id, "samples/step_00001.html", str(folder / "dl"))).read_text()
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_00001.json", str(folder / "dl"))).read_text())
    assert text.count('<tr class="sample">') == 5 == len(table["data"])
    images = html_images(text)
    assert len(images) == 5 and all(image.size == (32, 32) for image in images)
    prompts = table["data"]
    column = table["columns"].index("prompt")
    # Each row's image is the scene its prompt asks about (the training split's rows, by prompt).
    by_prompt = {}
    for row in scenes.split_rows("train"):
        by_prompt.setdefault(row["prompt"], set()).add(scenes.render(scenes.make_scene(row["scene_id"])).tobytes())
    for image, row in zip(images, prompts):
        assert image.convert("RGB").tobytes() in by_prompt[row[column]]


def test_polyrl_eval_of_a_vlm_folder_and_a_vlm_run_checkpoint_on_the_vqa_suite(tmp_path, vlm_dir, vlm_run):
    uri, run_id, _ = vlm_run
    out = tmp_path / "reports"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "POLYRL_CACHE": str(tmp_path / "cache"),
    }
    command = [
        sys.executable,
        "-m",
        "polyrl.cli.evaluate",
        "--model",
        str(vlm_dir),
        "--model",
        f"run:{run_id}",
        "--suite",
        "vqa",
        "--engine",
        "vllm",
        "--limit",
        str(LIMIT),
        "--out",
        str(out),
        "--kv-cache-gb",
        "0.25",
        "--max-model-len",
        "128",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    test_rows = scenes.split_rows("test")[:LIMIT]
    pictures = [scenes.render(scenes.make_scene(r["scene_id"])) for r in test_rows]
    reports = {}
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        report = json.loads((folder / "report.json").read_text())
        samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == LIMIT and [s["prompt"] for s in samples] == [r["prompt"] for r in test_rows]
        # The metrics are the per-sample table's: exact answers, scored by the suite.
        assert report["metrics"]["scenes/accuracy"] == pytest.approx(sum(s["correct"] for s in samples) / LIMIT)
        assert [s["correct"] for s in samples] == [
            float(s["completion"].strip() == r["answer"]) for s, r in zip(samples, test_rows)
        ]
        # The HTML table (report folder and MLflow eval run): one row per sample, the scene it asks about.
        html = (folder / "samples.html").read_text()
        assert html.count('<tr class="sample">') == LIMIT
        assert all(same_pixels(a, b) for a, b in zip(html_images(html), pictures)) and len(html_images(html)) == LIMIT
        logged = MlflowClient(uri).download_artifacts(report["mlflow_run_id"], "samples.html", str(tmp_path / "dl" / folder.name))
        assert Path(logged).read_text() == html
        reports[report["model"]["run_id"]] = (report, samples)
    assert set(reports) == {None, run_id}
    checkpoint_report = reports[run_id][0]
    assert checkpoint_report["model"]["step"] == 1 and checkpoint_report["model"]["ref"] == f"run:{run_id}"
    assert json.loads((Path(checkpoint_report["model"]["path"]) / "config.json").read_text())["vision_config"]
    assert MlflowClient(uri).get_run(checkpoint_report["mlflow_run_id"]).data.tags["polyrl.evaluates_run"] == run_id
    assert (out / "comparison.md").is_file()

    # The images reach the model through vLLM as through transformers: greedy answers agree.
    from polyrl.engines.base import build_rollout_engine

    engine = build_rollout_engine("hf", str(vlm_dir), seed=0)
    try:
        hf_rows = SuiteRunner("vqa", limit=LIMIT).run(engine).rows
    finally:
        engine.close()
    vllm_rows = reports[None][1]
    same = sum(a["completion"] == b["completion"] for a, b in zip(vllm_rows, hf_rows))
    assert same >= LIMIT - 1, [(a["completion"], b["completion"]) for a, b in zip(vllm_rows, hf_rows)]
