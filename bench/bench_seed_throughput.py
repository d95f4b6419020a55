"""Seed-runs per hour on this machine: seeds one after another with every core each, against
seeds at once with a share of the cores each.

Run: ``python bench/bench_seed_throughput.py`` (defaults: the GRPO arm of
``experiments/real/grpo_vs_drgrpo.yaml``, SmolLM2-135M-Instruct with vLLM, 4 training steps, an
evaluation at step 0 and at the end, seeds 0 and 1; ``--quick`` runs the tiny policy instead).

Each mode is one ``polyrl run`` of the seeds, so start-up, evaluation and logging count as they
do in a study:

* **one after another** (``--seeds-at-once 1``): seed after seed in the driver's process, each
  with every core (``train.threads`` unset);
* **at once** (``--seeds-at-once <seeds>``): every seed in a spawned process of its own, each
  with ``cores / seeds`` threads (the learner's and the in-process vLLM engine's; the operating
  system places the processes on the cores).

It prints each mode's wall time and seed-runs per hour, their ratio, and whether a seed's logged
metrics are the same in both modes (they are when both modes give a run the same thread count:
``--threads-equal`` runs the one-after-another mode at the at-once count too). Figures go in
docs/benchmarks.md; on a loaded machine every figure moves: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
POLYRL = Path(sys.executable).with_name("polyrl")

# Metrics that measure time or the machine, not the training: they differ between any two runs.
TIMING_PREFIXES = ("time/", "perf/", "compute/seconds", "system/", "throughput/", "timing/")


def write_config(source: Path, folder: Path, name: str, steps: int, seeds: list[int], threads: int | None) -> Path:
    raw = yaml.safe_load(source.read_text())
    raw.pop("until_resolved", None)
    raw.pop("seed", None)
    raw["seeds"] = seeds
    raw["name"] = name
    raw.setdefault("train", {})["steps"] = steps
    if threads is not None:
        raw["train"]["threads"] = threads
    raw.setdefault("eval", {})["every"] = steps
    raw["checkpoint"] = {"dir": str(folder / "checkpoints"), "every": steps, "keep": 1}
    raw.setdefault("tracking", {})["uri"] = f"sqlite:///{folder / 'mlflow.db'}"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def seed_histories(folder: Path, name: str) -> dict[int, dict[str, dict[int, float]]]:
    """Per seed, every logged metric's history but those that time the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    out: dict[int, dict[str, dict[int, float]]] = {}
    for run in client.search_runs([experiment.experiment_id]):
        if "seed" not in run.data.params or run.data.params["seed"] in ("", "None"):
            continue  # the experiment's and the arm's runs
        histories: dict[str, dict[int, float]] = {}
        for key in run.data.metrics:
            if key.startswith(TIMING_PREFIXES) or key.endswith("_s") or any(w in key for w in ("per_s", "seconds", "time")):
                continue
            histories[key] = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        out[int(run.data.params["seed"])] = histories
    return out


def run_mode(label: str, source: Path, arm: str, steps: int, seeds: list[int], threads: int | None, at_once: int):
    """One ``polyrl run`` of every seed with ``--seeds-at-once at_once``: its wall time and histories."""
    folder = Path(tempfile.mkdtemp(prefix=f"seeds_{label}_"))
    config = write_config(source, folder, f"bench_{label}", steps, seeds, threads)
    command = [str(POLYRL), "run", str(config), "--arm", arm, "--no-progress", "--seeds-at-once", str(at_once)]
    began = time.perf_counter()
    with open(folder / "run.log", "w") as log:
        code = subprocess.run(command, cwd=folder, stdout=log, stderr=log).returncode
    wall = time.perf_counter() - began
    if code:
        raise SystemExit(f"{label}: the run failed (exit code {code}); its output: {folder / 'run.log'}")
    return wall, seed_histories(folder, config.stem), folder


def largest_difference(a: dict[str, dict[int, float]], b: dict[str, dict[int, float]]) -> tuple[float, str, int]:
    worst = (0.0, "", 0)
    for key in sorted(set(a) | set(b)):
        steps = set(a.get(key, {})) | set(b.get(key, {}))
        if set(a.get(key, {})) != set(b.get(key, {})):
            return float("inf"), key, -1
        for step in steps:
            diff = abs(a[key][step] - b[key][step])
            if diff == diff and diff > worst[0]:
                worst = (diff, key, step)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="experiments/real/grpo_vs_drgrpo.yaml")
    parser.add_argument("--arm", default="grpo")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--quick", action="store_true", help="the tiny policy of experiments/grpo_vs_drgrpo.yaml")
    parser.add_argument(
        "--threads-equal", action="store_true", help="one after another at the at-once thread count (checks equal metrics)"
    )
    args = parser.parse_args()
    if args.quick:
        args.experiment = "experiments/grpo_vs_drgrpo.yaml"
    seeds = [int(s) for s in args.seeds.split(",")]
    cores = os.cpu_count() or 1
    if cores < len(seeds):
        raise SystemExit(f"{cores} cores: at least one core per seed is needed for the at-once mode")
    source = ROOT / args.experiment
    per_seed = cores // len(seeds)
    sequential_threads = per_seed if args.threads_equal else cores
    print(f"{args.experiment} arm {args.arm}, {args.steps} steps, seeds {seeds}, {cores} cores", flush=True)
    seq_wall, seq_metrics, seq_dir = run_mode(
        "one_after_another", source, args.arm, args.steps, seeds, per_seed if args.threads_equal else None, 1
    )
    print(f"one after another ({sequential_threads} threads each): {seq_wall:.0f} s", flush=True)
    par_wall, par_metrics, par_dir = run_mode("at_once", source, args.arm, args.steps, seeds, None, len(seeds))
    print(f"at once ({per_seed} thread(s) each): {par_wall:.0f} s", flush=True)
    print()
    print("| mode | threads per run | wall s | seed-runs per hour |")
    print("|---|---|---|---|")
    for label, threads, wall in (("one after another", sequential_threads, seq_wall), ("at once", per_seed, par_wall)):
        print(f"| {label} | {threads} | {wall:.0f} | {len(seeds) * 3600 / wall:.1f} |")
    print(f"\nat once / one after another, seed-runs per hour: {seq_wall / par_wall:.2f}x")
    for seed in seeds:
        diff, key, step = largest_difference(seq_metrics[seed], par_metrics[seed])
        same = "identical" if diff == 0 else f"largest difference {diff:.3g} ({key} at step {step})"
        print(f"seed {seed}: metrics in the two modes: {same}")
    print(f"logs: {seq_dir}, {par_dir}")


if __name__ == "__main__":
    main()
