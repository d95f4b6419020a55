"""The one eval through the vLLM engine, as a user runs it: the command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from polyrl.evals import SuiteRunner  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROWS = [{"prompt": f"Q: {i}-1=? A:", "answer": str(i - 1)} for i in range(1, 7)]


def test_eval_vllm_engine_report_matches_its_samples_and_hf(tmp_path, jsonl, suite_file, tiny_model, hf_engine):
    jsonl(tmp_path / "v.jsonl", ROWS)
    suite = suite_file(
        tmp_path / "v.yaml",
        {
            "name": "v",
            "datasets": {"name": "v", "source": "v.jsonl"},
            "generation": {"decoding": "greedy", "max_tokens": 6},
            "metrics": {"accuracy": {"extract": "last_number"}, "rewards": [{"module": "length", "params": {"unit": "chars"}}]},
        },
    )
    out = tmp_path / "report"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    command = [
        sys.executable,
        "-m",
        "polyrl.cli.evaluate",
        "--model",
        str(tiny_model),
        "--suite",
        str(suite),
        "--engine",
        "vllm",
        "--out",
        str(out),
        "--kv-cache-gb",
        "0.25",
        "--max-model-len",
        "64",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert report["engine"] == "vllm" and len(samples) == 6
    metrics = report["metrics"]
    # Numbers recomputed from the per-sample table.
    assert metrics["v/accuracy"] == pytest.approx(sum(s["correct"] for s in samples) / 6)
    assert metrics["v/length/mean"] == pytest.approx(sum(s["length"] for s in samples) / 6)
    assert metrics["v/reward/length/mean"] == pytest.approx(sum(len(s["completion"]) / 100 for s in samples) / 6)
    assert metrics["v/length/truncated_share"] == pytest.approx(sum(s["finish_reason"] == "length" for s in samples) / 6)
    # Greedy fp32 decoding of the same weights: vLLM and transformers agree on the text.
    hf_rows = SuiteRunner(suite).run(hf_engine).rows
    same = sum(a["completion"] == b["completion"] for a, b in zip(samples, hf_rows))
    assert same >= 5, [(a["completion"], b["completion"]) for a, b in zip(samples, hf_rows)]
