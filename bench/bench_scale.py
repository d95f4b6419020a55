"""One experiment over (rollout workers, learner ranks, staleness), measured and predicted.

Run: ``python bench/bench_scale.py [experiments/grpo_vs_drgrpo.yaml] [--arm grpo] [--steps 12]
[--set model.builtin.size=3m] [--rounds 2] [--grid 1,1,0 2,1,0 1,2,0 1,1,1]``.

Each grid point is one ``polyrl run`` of the arm in a fresh process, with ``--set
rollout.workers=W --set train.learner_workers=R --set rollout.max_staleness=K`` (and the
steps, a private MLflow store and checkpoint folder). From its MLflow run it reads the step
time as the spacing of the ``train/step`` timestamps over the steps after the first two (so the
engines' warm-up and an asynchronous loop's overlap both count as they are), samples per step
(``rollout/samples``) and the mean ``perf/<phase>_s``. The first point (1, 1, 0: the in-process
loop) gives the phase times :mod:`polyrl.analysis.schedule_model` predicts every other point from; the
table shows measured and predicted samples/s side by side and the measured overhead against the
first point.

On a machine with fewer cores than the grid's parts (2 here) the parts share the cores that the
in-process loop had to itself, so no speed-up is expected: the model assumes a device per part.
The difference between the two columns is then the price of the Ray path (actors, the object
store, torch.distributed over gloo) plus the contention, which is what this bench is for.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_point(config: Path, arm: str, steps: int, point: tuple[int, int, int], folder: Path, extra: list[str]) -> dict:
    from mlflow.tracking import MlflowClient

    workers, ranks, staleness = point
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    sets = [
        *extra,
        f"train.steps={steps}",
        f"tracking.uri={uri}",
        f"checkpoint.dir={folder / 'runs'}",
        f"checkpoint.every={steps}",
    ]
    # Only what differs from the defaults: a point needs only its own feature's field.
    sets += [
        f"{key}={value}"
        for key, value, default in (
            ("rollout.workers", workers, 1),
            ("train.learner_workers", ranks, 1),
            ("rollout.max_staleness", staleness, 0),
        )
        if value != default
    ]
    command = [sys.executable, "-m", "polyrl.cli.main", "run", str(config), "--arm", arm, "--no-progress"]
    for option in sets:
        command += ["--set", option]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        return {"point": point, "error": (done.stderr or done.stdout).strip().splitlines()[-1][:200], "wall_s": wall}
    client = MlflowClient(uri)
    (run,) = [
        r
        for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
        if r.data.tags.get("polyrl.arm") == arm
    ]
    marks = sorted(client.get_metric_history(run.info.run_id, "train/step"), key=lambda m: m.step)
    spacing = [(b.timestamp - a.timestamp) / 1000 for a, b in zip(marks[2:], marks[3:])]

    def mean(key: str) -> float:
        values = [m.value for m in client.get_metric_history(run.info.run_id, key) if m.step > 1]
        return statistics.fmean(values) if values else 0.0

    phases = {phase: mean(f"perf/{phase}_s") for phase in ("generate", "score", "advantage", "update", "sync", "log")}
    return {
        "point": point,
        "step_s": statistics.median(spacing) if spacing else float("nan"),
        "samples": mean("rollout/samples"),
        "sync_share": mean("perf/sync_share"),
        "prompts": int(run.data.params["rollout.prompts_per_step"]),
        "phases": phases,
        "wall_s": wall,
    }


def combine(runs: list[dict]) -> dict:
    """One point over its rounds: the median step, the mean phase times and shares; a failed
    round fails the point (its error is the first one's)."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    return {
        "point": runs[0]["point"],
        "step_s": statistics.median(run["step_s"] for run in runs),
        "rounds": [run["step_s"] for run in runs],
        "samples": statistics.fmean(run["samples"] for run in runs),
        "sync_share": statistics.fmean(run["sync_share"] for run in runs),
        "prompts": runs[0]["prompts"],
        "phases": {phase: statistics.fmean(run["phases"][phase] for run in runs) for phase in runs[0]["phases"]},
        "wall_s": sum(run["wall_s"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "experiments" / "grpo_vs_drgrpo.yaml"))
    parser.add_argument("--arm", default="grpo")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="passed to every point's `polyrl run` (e.g. model.builtin.size=3m), before the bench's own",
    )
    parser.add_argument(
        "--keep", metavar="DIR", default=None, help="keep each point's MLflow store and checkpoints under DIR/<index>"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the grid this many times, interleaved; the table gives each point's median step and every round's",
    )
    parser.add_argument("--grid", nargs="+", default=["1,1,0", "2,1,0", "1,2,0", "1,1,1"], help="workers,ranks,staleness points")
    args = parser.parse_args()

    from polyrl.analysis.schedule_model import Cluster, PhaseTimes, predict

    points = [tuple(int(x) for x in p.split(",")) for p in args.grid]
    rounds: list[list[dict]] = [[] for _ in points]
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as scratch:
        tmp = args.keep or scratch
        for round_index in range(args.rounds):
            # Each round starts one point later, so no point always runs first (or right after the slowest).
            shift = round_index % len(points)
            for index in [*range(shift, len(points)), *range(shift)]:
                point = points[index]
                result = run_point(
                    Path(args.config), args.arm, args.steps, point, Path(tmp) / f"{index}-{round_index}", args.sets
                )
                rounds[index].append(result)
                said = result.get("error") or f"{result['step_s']:.3f} s/step"
                print(f"round {round_index} {point}: {said} ({result['wall_s']:.0f} s)", flush=True)
    results = [combine(runs) for runs in rounds]
    base = results[0]
    if "error" in base:
        raise SystemExit(f"the first point {base['point']} failed: {base['error']}")
    p = base["phases"]
    # The step's time outside the timed phases (MLflow writes after the step's timer) counts as
    # serial driver time, so the model reproduces the first point's measured step.
    outside = max(0.0, base["step_s"] - sum(p.values()))
    times = PhaseTimes(
        generate=p["generate"],
        score=p["score"],
        logprobs=p["advantage"],
        update=p["update"],
        sync=p["sync"],
        log=p["log"] + outside,
        prompts=base["prompts"],
        samples=round(base["samples"]),
    )
    print(
        f"\n{args.config} arm {args.arm}"
        + "".join(f" --set {s}" for s in args.sets)
        + f", {args.steps} steps, phase means from step 2 of the first point: "
        + ", ".join(f"{k} {v:.3f} s" for k, v in p.items())
        + f", outside the phases {outside:.3f} s"
    )
    # sync share: the weight sync's mean share of the learner's step (polyrl's own health heuristic, health.max_sync_share).
    print(
        "| workers, ranks, k | measured s/step (median; rounds) | samples/s | predicted samples/s | vs first point | generate s "
        "| update s | sync share |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        w, r, k = result["point"]
        if "error" in result:
            print(f"| {w}, {r}, {k} | failed: {result['error']} | | | | | | |")
            continue
        # Engines on the ranks' devices when there is one of each per device, else on their own.
        predicted = predict(times, Cluster(workers=w, learner_ranks=r, staleness=k, colocated=(k == 0 and w == r)))
        measured = result["samples"] / result["step_s"]
        first = base["samples"] / base["step_s"]
        each = ", ".join(f"{x:.3f}" for x in result["rounds"])
        print(
            f"| {w}, {r}, {k} | {result['step_s']:.3f} ({each}) | {measured:.1f} | {predicted.samples_per_s:.1f} | "
            f"{measured / first - 1:+.0%} | {result['phases']['generate']:.3f} | {result['phases']['update']:.3f} | {result['sync_share']:.1%} |"
        )


if __name__ == "__main__":
    main()
