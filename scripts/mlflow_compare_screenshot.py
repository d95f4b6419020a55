"""Screenshot the MLflow view ``polyrl compare`` links to, for a small 2-arm × 3-seed experiment
(docs/mlflow_compare.png): the chart view of the arms, seeds grouped by arm.

Runs the experiment against a real ``mlflow server`` on 127.0.0.1, writes the comparison
(``polyrl compare``), takes the URL polyrl prints, and captures it with headless Chromium (the
OS package), driven by playwright-core when node has it (it waits for the data and closes
MLflow's Assistant side panel), else by Chromium's own ``--screenshot``. With ``--note-out``
also the parent run's page (its headline metrics and the report as description). Usage::

    npm install --prefix /tmp/pw playwright-core   # optional
    NODE_PATH=/tmp/pw/node_modules .venv/bin/python scripts/mlflow_compare_screenshot.py \
        --out docs/mlflow_compare.png --note-out docs/mlflow_parent_run.png
    # or capture an experiment already run (e.g. make demo's, over seeds), running nothing:
    ... --store sqlite:///$PWD/mlflow.db --experiment grpo_vs_drgrpo
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

EXPERIMENT = {
    "name": "mlflow_ui_demo",
    "description": "GRPO vs Dr.GRPO over 3 seeds, for the MLflow UI screenshot",
    "seeds": 3,
    "model": {"builtin": {"size": "0.3m", "seed": 0}},
    "data": {"source": "arithmetic"},
    "rollout": {"engine": "hf", "prompts_per_step": 4, "samples_per_prompt": 8, "max_tokens": 48},
    "rewards": [{"module": "accuracy", "params": {"extract": "hash"}}],
    "train": {"steps": 12, "learning_rate": 2.0e-4, "micro_batch_size": 32, "threads": 1},
    "tracking": {"progress": False, "sample_table_every": 4},
    "eval": {"every": 4, "suite": "arithmetic", "limit": 32},
    "checkpoint": {"every": 12, "keep": 1},
    "arms": {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow server at {url} did not come up")


CAPTURE_JS = Path(__file__).with_name("mlflow_capture.js")


def has_playwright() -> bool:
    node = shutil.which("node")
    return bool(node) and subprocess.run([node, "-e", "require.resolve('playwright-core')"], capture_output=True).returncode == 0


def capture(url: str, out: Path, *, wait_text: str, height: int = 900, click_text: str = "") -> None:
    if has_playwright():
        subprocess.run(["node", str(CAPTURE_JS), url, str(out), wait_text, str(height), click_text], check=True, timeout=300)
    else:
        chromium_screenshot(url, out, size=f"1400,{height}")


def chromium_screenshot(url: str, out: Path, *, size: str = "1400,900", budget_ms: int = 20000) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--hide-scrollbars",
                f"--virtual-time-budget={budget_ms}",
                f"--window-size={size}",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=180,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/mlflow_compare.png"))
    parser.add_argument("--note-out", type=Path, default=None, help="also capture the parent run's page (its description)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--store",
        default=None,
        help="an existing store (sqlite:///…) to serve instead of running the "
        "small experiment; with --experiment, the experiment of it to compare and capture",
    )
    parser.add_argument("--experiment", default=EXPERIMENT["name"])
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="polyrl_ui_"))
    work.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            str(bin_dir / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            args.store or f"sqlite:///{work / 'mlflow.db'}",
            "--artifacts-destination",
            str(work / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(url)
        env = os.environ | {"MLFLOW_TRACKING_URI": url}
        if args.store is None:
            config = dict(EXPERIMENT, checkpoint={**EXPERIMENT["checkpoint"], "dir": str(work / "runs")})
            (work / "exp.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            started = time.time()
            subprocess.run(
                [str(bin_dir / "polyrl"), "run", str(work / "exp.yaml"), "--no-progress"], check=True, env=env, cwd=work
            )
            print(f"run: {time.time() - started:.0f} s")
        compare = subprocess.run(
            [str(bin_dir / "polyrl"), "compare", args.experiment, "--out", str(work / "report")],
            check=True,
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
        )
        print(compare.stdout)
        compare_url = next(
            line.split("): ", 1)[1].strip()
            for line in compare.stdout.splitlines()
            if line.startswith("Compare the arms in MLflow")
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        capture(compare_url, args.out, wait_text="polyrl comparison", height=1100)
        print(f"screenshot of {compare_url}\n  -> {args.out}")
        if args.note_out is not None:
            from mlflow.tracking import MlflowClient

            from polyrl.tracking.mlflow_runs import find_parent_run

            parent = find_parent_run(MlflowClient(url), args.experiment)
            page = f"{url}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
            capture(page, args.note_out, wait_text="Metrics", height=1300)
            print(f"screenshot of {page}\n  -> {args.note_out}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
