"""Seed-runs per hour on this machine: seeds one after another with every core each, against
seeds at once with a share of the cores each.

Run: ``python bench/bench_seed_throughput.py`` (defaults: the GRPO arm of
``experiments/real/grpo_vs_drgrpo.yaml``, SmolLM2-135M-Instruct with vLLM, 4 training steps, an
evaluation at step 0 and at the end, seeds 0 and 1; ``--quick`` runs the tiny policy instead).

Each seed is a real ``polyrl run`` process (a fresh interpreter, vLLM engine, MLflow store of its
own), so start-up, evaluation and logging count as they do in a study. Two modes:

* **one after another**: seed after seed, each with ``train.threads = cores`` (the default of a
  single ``polyrl run``);
* **at once**: all seeds started together, each with ``cores / seeds`` threads (the learner's
  and the in-process vLLM engine's; the operating system places the processes on the cores).

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


def write_config(source: Path, folder: Path, name: str, steps: int, seed: int, threads: int) -> Path:
    raw = yaml.safe_load(source.read_text())
    raw.pop("until_resolved", None)
    raw.pop("seeds", None)
    raw["name"] = name
    raw["seed"] = seed
    raw.setdefault("train", {}).update({"steps": steps, "threads": threads})
    raw.setdefault("eval", {})["every"] = steps
    raw["checkpoint"] = {"dir": str(folder / "checkpoints"), "every": steps, "keep": 1}
    # A store per run: two processes creating one new SQLite store race on its schema migration.
    raw.setdefault("tracking", {})["uri"] = f"sqlite:///{folder / name}.db"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def start(config: Path, arm: str, threads: int, folder: Path) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    log = open(folder / f"{config.stem}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(POLYRL), "run", str(config), "--arm", arm, "--no-progress"], cwd=folder, env=env, stdout=log, stderr=log
    )


def final_metrics(folder: Path, name: str) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / name}.db")
    experiment = client.get_experiment_by_name(name)
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "polyrl.arm" in r.data.tags or r.data.metrics]
    histories: dict[str, dict[int, float]] = {}
    for run in runs:
        for key in run.data.metrics:
            if key.startswith(TIMING_PREFIXES) or key.endswith("_s") or any(w in key for w in ("per_s", "seconds", "time")):
                continue
            histories[key] = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    return histories


def run_mode(label: str, source: Path, arm: str, steps: int, seeds: list[int], threads: int, at_once: bool):
    folder = Path(tempfile.mkdtemp(prefix=f"seeds_{label}_"))
    configs = [write_config(source, folder, f"bench_{label}_seed{seed}", steps, seed, threads) for seed in seeds]
    began = time.perf_counter()
    if at_once:
        procs = [start(c, arm, threads, folder) for c in configs]
        codes = [p.wait() for p in procs]
    else:
        codes = [start(c, arm, threads, folder).wait() for c in configs]
    wall = time.perf_counter() - began
    if any(codes):
        raise SystemExit(f"{label}: a run failed (exit codes {codes}); logs in {folder}")
    metrics = {seed: final_metrics(folder, c.stem) for seed, c in zip(seeds, configs)}
    return wall, metrics, folder


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
    seq_wall, seq_metrics, seq_dir = run_mode("one_after_another", source, args.arm, args.steps, seeds, sequential_threads, False)
    print(f"one after another ({sequential_threads} threads each): {seq_wall:.0f} s", flush=True)
    par_wall, par_metrics, par_dir = run_mode("at_once", source, args.arm, args.steps, seeds, per_seed, True)
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
