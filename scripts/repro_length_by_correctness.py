"""Response length of right and wrong answers per arm over seeds, from the sample tables.

The Dr.GRPO claim (seed 003 §4.3) is about the length of *wrong* answers, which no training
metric isolates; each seed run's sample tables (``samples/step_*.json``: reward and length of
every logged sample) do. For the first and last logged table of each seed, the mean length of
wrong (reward <= 0) and right answers; per arm the mean over seeds with a 95% t-interval, and
the change first → last. Usage::

    .venv/bin/python scripts/repro_length_by_correctness.py repro_drgrpo_vs_grpo --tracking-uri sqlite:///mlflow.db
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from polyrl.launch.stats import mean_interval, verdict, welch_difference
from polyrl.tracking.mlflow_runs import ARM_TAG, find_arm_runs, find_parent_run, find_seed_runs, make_client


def table_lengths(client, run_id: str, path: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        local = client.download_artifacts(run_id, path, folder)
        data = json.loads(Path(local).read_text())
    rows = [dict(zip(data["columns"], row)) for row in data["data"]]
    wrong = [r["length"] for r in rows if r["reward"] is not None and r["reward"] <= 0]
    right = [r["length"] for r in rows if r["reward"] is not None and r["reward"] > 0]
    return (float(np.mean(wrong)) if wrong else float("nan"), float(np.mean(right)) if right else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    args = parser.parse_args()
    client = make_client(args.tracking_uri)
    parent = find_parent_run(client, args.experiment)
    per_arm: dict[str, dict[str, list[float]]] = {}
    for arm_run in find_arm_runs(client, parent.info.experiment_id, parent.info.run_id):
        arm = arm_run.data.tags[ARM_TAG]
        values = per_arm.setdefault(arm, {"wrong_first": [], "wrong_last": [], "right_first": [], "right_last": []})
        for seed_run in find_seed_runs(client, parent.info.experiment_id, arm_run.info.run_id):
            tables = sorted(a.path for a in client.list_artifacts(seed_run.info.run_id, "samples"))
            (wrong_first, right_first), (wrong_last, right_last) = (table_lengths(client, seed_run.info.run_id, tables[0]),
                                                                    table_lengths(client, seed_run.info.run_id, tables[-1]))
            for key, value in (("wrong_first", wrong_first), ("wrong_last", wrong_last), ("right_first", right_first),
                               ("right_last", right_last)):
                values[key].append(value)
            print(f"{arm} seed {seed_run.data.tags['polyrl.seed']}: {tables[0]} -> {tables[-1]}: wrong {wrong_first:.1f} -> "
                  f"{wrong_last:.1f}, right {right_first:.1f} -> {right_last:.1f}")
    print("\n| arm | wrong answers: length first → last table (mean ± 95% CI) | change | right answers: first → last |")
    print("|---|---|---|---|")
    changes = {}
    for arm, values in per_arm.items():
        change = [last - first for first, last in zip(values["wrong_first"], values["wrong_last"])]
        changes[arm] = change
        print(f"| {arm} | {mean_interval(values['wrong_first']).format()} → {mean_interval(values['wrong_last']).format()} | "
              f"{mean_interval(change).format()} | {mean_interval(values['right_first']).format()} → "
              f"{mean_interval(values['right_last']).format()} |")
    arms = list(changes)
    if len(arms) == 2:
        difference = welch_difference(changes[arms[0]], changes[arms[1]])
        print(f"\nchange in wrong-answer length, {arms[0]} − {arms[1]}: {difference.format()} "
              f"[{difference.low:.3g}, {difference.high:.3g}] · {verdict(difference, names=tuple(arms))}")


if __name__ == "__main__":
    main()
