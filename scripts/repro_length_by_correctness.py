"""Response length of right and wrong answers per arm over seeds, from the sample tables.

The Dr.GRPO claim ("Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783) is about the length of *wrong* answers, which no training
metric isolates; each seed run's sample tables (``samples/step_*.json``: reward and length of
every logged sample) do. Per seed and logged step: the mean length of wrong (reward <= 0) and
right answers, and the share of answers in the long worked form (the arithmetic task's
completions start with ``work:`` or ``####``, so the long/short choice is one token). Per arm:
the first table against the mean of the last ``--last`` tables (one table is 64 samples, the
mean of several steadies it), the mean over seeds with a 95% t-interval, the change, and the
difference between two arms: paired by seed when both ran the same seeds (a seed draws the same
prompts and first rollout in both), else Welch, with Holm-adjusted p-values over all its rows. ``--plot-dir`` draws the per-step curves
(mean over seeds, shaded 95% band). Usage::

    .venv/bin/python scripts/repro_length_by_correctness.py repro_drgrpo_vs_grpo \\
        --tracking-uri sqlite:///mlflow.db --last 4 --plot-dir docs/reproductions/drgrpo_vs_grpo
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from polyrl.analysis.stats import arm_difference, curve_band, holm_adjusted, mean_interval, verdict
from polyrl.tracking.mlflow_runs import ARM_TAG, find_arm_runs, find_parent_run, find_seed_runs, make_client

# One progress bar per downloaded table would bury the output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

LONG_MARKER = "work:"
QUANTITIES = ("wrong length", "right length", "long share", "wrong long share")


def table_summary(columns: list[str], data: list[list]) -> dict[str, float]:
    """Mean length of wrong and right answers, and the long-form share (all, and of wrong ones)."""
    rows = [dict(zip(columns, row)) for row in data]
    scored = [r for r in rows if r.get("reward") is not None]
    wrong = [r for r in scored if r["reward"] <= 0]
    right = [r for r in scored if r["reward"] > 0]

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else math.nan

    def is_long(row: dict) -> float:
        return float(str(row.get("completion", "")).lstrip().startswith(LONG_MARKER))

    return {
        "wrong length": mean([r["length"] for r in wrong]),
        "right length": mean([r["length"] for r in right]),
        "long share": mean([is_long(r) for r in scored]),
        "wrong long share": mean([is_long(r) for r in wrong]),
    }


def first_and_late(per_step: dict[int, dict[str, float]], last: int) -> tuple[dict[str, float], dict[str, float]]:
    """The first logged step's summary and the nan-aware mean of the last ``last`` steps' summaries."""
    steps = sorted(per_step)
    late_steps = steps[-last:]
    late = {}
    for key in QUANTITIES:
        values = [per_step[s][key] for s in late_steps if not math.isnan(per_step[s][key])]
        late[key] = float(np.mean(values)) if values else math.nan
    return per_step[steps[0]], late


def read_table(client, run_id: str, path: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        data = json.loads(Path(client.download_artifacts(run_id, path, folder)).read_text())
    return table_summary(data["columns"], data["data"])


def step_of(path: str) -> int:
    return int(Path(path).stem.split("_")[-1])


def band_plot(per_arm_steps: dict[str, list[dict[int, dict[str, float]]]], key: str, ylabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    for arm, seeds in per_arm_steps.items():
        histories = [[(s, v[key]) for s, v in sorted(seed.items()) if not math.isnan(v[key])] for seed in seeds]
        steps, mean, low, high = curve_band(histories)
        (line,) = axis.plot(steps, mean, label=f"{arm} ({len(seeds)} seeds)")
        axis.fill_between(steps, low, high, alpha=0.2, color=line.get_color())
    axis.set_xlabel("step")
    axis.set_ylabel(ylabel)
    axis.set_title(f"{ylabel}: mean over seeds, 95% band")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--last", type=int, default=1, help="average the last N sample tables (default 1)")
    parser.add_argument("--plot-dir", type=Path, default=None)
    args = parser.parse_args()
    client = make_client(args.tracking_uri)
    parent = find_parent_run(client, args.experiment)
    per_arm_steps: dict[str, list[dict[int, dict[str, float]]]] = {}
    per_arm: dict[str, dict[str, dict[int, float]]] = {}  # arm -> "<quantity> <part>" -> seed -> value
    for arm_run in find_arm_runs(client, parent.info.experiment_id, parent.info.run_id):
        arm = arm_run.data.tags[ARM_TAG]
        values = per_arm.setdefault(arm, {})
        for seed_run in find_seed_runs(client, parent.info.experiment_id, arm_run.info.run_id):
            if seed_run.info.status != "FINISHED":  # a failed or unfinished seed's late tables are not the run's end
                print(f"left out: {arm} seed {seed_run.data.tags.get('polyrl.seed')} ({seed_run.info.status})")
                continue
            run_id = seed_run.info.run_id
            tables = [a.path for a in client.list_artifacts(run_id, "samples") if a.path.endswith(".json")]
            per_step = {step_of(path): read_table(client, run_id, path) for path in tables}
            per_arm_steps.setdefault(arm, []).append(per_step)
            first, late = first_and_late(per_step, args.last)
            seed = int(seed_run.data.tags.get("polyrl.seed", "0"))
            for key in QUANTITIES:
                values.setdefault(f"{key} first", {})[seed] = first[key]
                values.setdefault(f"{key} late", {})[seed] = late[key]
                values.setdefault(f"{key} change", {})[seed] = late[key] - first[key]
            steps = sorted(per_step)
            print(
                f"{arm} seed {seed_run.data.tags.get('polyrl.seed')}: step {steps[0]} -> last {args.last} of "
                f"{steps[-args.last :]}: " + ", ".join(f"{k} {first[k]:.3g} -> {late[k]:.3g}" for k in QUANTITIES)
            )
    late_label = "last table" if args.last == 1 else f"mean of last {args.last} tables"
    print(f"\n| arm | quantity | first table | {late_label} | change |")
    print("|---|---|---|---|---|")
    for arm, values in per_arm.items():
        for key in QUANTITIES:
            cells = [mean_interval(list(values[f"{key} {part}"].values())).format() for part in ("first", "late", "change")]
            print(f"| {arm} | {key} | " + " | ".join(cells) + " |")
    arms = list(per_arm)
    if len(arms) == 2:
        rows = [
            (f"{key} {part}", arm_difference(per_arm[arms[0]][f"{key} {part}"], per_arm[arms[1]][f"{key} {part}"]))
            for key in QUANTITIES
            for part in ("late", "change")
        ]
        adjusted = holm_adjusted([d.p_value for _, d in rows])
        tested = sum(p == p for p in adjusted)
        for (name, d), p in zip(rows, adjusted):
            i = d.interval
            print(
                f"{name}, {arms[0]} − {arms[1]} ({d.method}): {i.format()} [{i.low:.3g}, {i.high:.3g}], Holm p {p:.2g} · "
                f"{verdict(i, names=tuple(arms), adjusted_p=p, comparisons=tested)}"
            )
    if args.plot_dir is not None:
        args.plot_dir.mkdir(parents=True, exist_ok=True)
        band_plot(per_arm_steps, "wrong length", "length of wrong answers (tokens)", args.plot_dir / "wrong_answer_length.png")
        band_plot(per_arm_steps, "long share", "share of answers in the long worked form", args.plot_dir / "long_form_share.png")
        print(f"plots in {args.plot_dir}")


if __name__ == "__main__":
    main()
