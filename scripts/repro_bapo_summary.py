"""Per-seed summaries for the BAPO reproduction (BAPO, arXiv 2510.18927), with intervals over seeds.

Also usable on the other clip reproductions (the bapo/* rows and plots are then left out).

``polyrl compare`` tabulates each metric's last logged value; the BAPO claim is about the
course of a run (does entropy stay higher, is the positive share held near its target), so
this script summarises each seed run's whole history, then gives per arm the mean over seeds
with a 95% t-interval and, for the first two arms, the difference: paired by seed when both arms
ran the same seeds (else Welch), with Holm-adjusted p-values over all the table's rows. It also
draws the positive share and the clip bounds per step (mean and 95% band over seeds). Usage::

    .venv/bin/python scripts/repro_bapo_summary.py repro_bapo_vs_fixed_clip \\
        --tracking-uri sqlite:///mlflow.db --target 0.5 --out reports/bapo_extra

``--from-summary summary.md`` recomputes the table from the per-seed lines an earlier run of
this script printed (``- <arm> seed <s>: steps N, <quantity> <value>, …``), without MLflow.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from polyrl.analysis.stats import arm_difference, curve_band, holm_adjusted, mean_interval, verdict  # noqa: E402
from polyrl.tracking.mlflow_runs import ARM_TAG, SEED_TAG, find_arm_runs, find_parent_run, find_seed_runs, make_client  # noqa: E402

COLLAPSE_NATS = 0.1  # the health check's entropy_collapse threshold (polyrl/monitoring/health.py)
SEED_WINDOW = 0.03  # polyrl's design notes (unpublished): the positive share fluctuates within ±0.03 of its target
LAST_STEPS = 10  # train accuracy of one 64-sample step is noisy: average the last few

KEYS = (
    "actor/entropy",
    "bapo/positive_share",
    "actor/positive_share",
    "actor/pos_loss_share",
    "bapo/c_low",
    "bapo/c_high",
    "actor/clip_frac_low",
    "actor/clip_frac_high",
    "quadrant/low_prob_pos_adv",
    "train/accuracy",
)
EVAL_KEY = "eval/arithmetic/accuracy"  # --eval-key: the held-out accuracy of the run's suite


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def values(points: list[tuple[int, float]]) -> np.ndarray:
    return np.asarray([v for _, v in points], dtype=np.float64)


def first_step_below(points: list[tuple[int, float]], threshold: float) -> float:
    """First step whose value is below ``threshold``; one past the last step if none is."""
    for step, value in points:
        if value < threshold:
            return float(step)
    return float(points[-1][0] + 1) if points else math.nan


def summarise(h: dict[str, list[tuple[int, float]]], target: float, eval_key: str = EVAL_KEY) -> dict[str, float]:
    """One seed run's summaries; quantities whose metric the run did not log (an objective
    other than bapo has no ``bapo/*``) are left out."""

    def has(key: str) -> bool:
        return bool(h.get(key))

    out: dict[str, float] = {}
    if has("actor/entropy"):
        entropy = values(h["actor/entropy"])
        out["entropy, first step"] = entropy[0]
        out["entropy, mean over steps"] = entropy.mean()
        out[f"entropy, mean of last {LAST_STEPS} steps"] = entropy[-LAST_STEPS:].mean()
        out[f"first step with entropy < {COLLAPSE_NATS}"] = first_step_below(h["actor/entropy"], COLLAPSE_NATS)
    # BAPO's share (the one its search steers) and every objective's share at its own bounds.
    for key in ("bapo/positive_share", "actor/positive_share"):
        if not has(key):
            continue
        share = values(h[key])
        out[f"{key}, mean"] = share.mean()
        out[f"{key}, mean abs(share − target)"] = np.abs(share - target).mean()
        if key == "bapo/positive_share":
            out[f"steps with positive share within ±{SEED_WINDOW} of target (share)"] = (
                np.abs(share - target) <= SEED_WINDOW
            ).mean()
            out["steps with positive share below target (share)"] = (share < target).mean()
    for key, name in (
        ("actor/pos_loss_share", "actor/pos_loss_share, mean"),
        ("bapo/c_low", "bapo/c_low, mean"),
        ("bapo/c_high", "bapo/c_high, mean"),
        ("actor/clip_frac_low", "clip_frac_low, mean"),
        ("actor/clip_frac_high", "clip_frac_high, mean"),
        ("quadrant/low_prob_pos_adv", "low-prob/positive-adv token share, mean"),
    ):
        if has(key):
            out[name] = values(h[key]).mean()
    if has("train/accuracy"):
        out[f"train accuracy, mean of last {LAST_STEPS} steps"] = values(h["train/accuracy"])[-LAST_STEPS:].mean()
        out["train accuracy, last step"] = values(h["train/accuracy"])[-1]
    if has(eval_key):
        evals = h[eval_key]
        out["held-out accuracy, first eval"] = evals[0][1]
        out["held-out accuracy, last eval"] = evals[-1][1]
    return out


def difference_table(summaries: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """Markdown lines: per quantity each arm's mean ± half-width over seeds and, for two arms, the
    difference (paired by seed where the arms share their seeds, else Welch) with its 95% interval,
    Holm-adjusted p over all the rows, and the verdicts."""
    arms = list(summaries)
    names = list(dict.fromkeys(name for by_seed in summaries.values() for summary in by_seed.values() for name in summary))
    rows = []
    for name in names:
        per_arm = {arm: {seed: s[name] for seed, s in summaries[arm].items() if name in s} for arm in arms}
        rows.append((name, per_arm, arm_difference(per_arm[arms[0]], per_arm[arms[1]]) if len(arms) == 2 else None))
    adjusted = holm_adjusted([d.p_value for _, _, d in rows if d is not None]) if len(arms) == 2 else []
    tested = sum(p == p for p in adjusted)
    lines = [
        f"| quantity | {' | '.join(f'{a} ({len(summaries[a])} seeds)' for a in arms)} |"
        + (f" {arms[0]} − {arms[1]} (95%, method) | Holm-adjusted p |" if len(arms) == 2 else ""),
        "|---|" + "---|" * (len(arms) + 2 * (len(arms) == 2)),
    ]
    verdicts = []
    for index, (name, per_arm, d) in enumerate(rows):
        cells = [mean_interval(list(per_arm[a].values())).format() for a in arms]
        if d is not None:
            i, p = d.interval, adjusted[index]
            survives = not (math.isnan(i.low) or i.contains(0.0)) and p < 0.05
            cells.append(f"{i.estimate:+.3g} [{i.low:.3g}, {i.high:.3g}] ({d.method})" + (" *" if survives else ""))
            cells.append("–" if p != p else f"{p:.2g}")
            verdicts.append(f"{name}: {verdict(i, names=(arms[0], arms[1]), adjusted_p=p, comparisons=tested)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if len(arms) == 2:
        lines += [
            "",
            f"* the interval excludes 0 and the difference holds after Holm's correction over the {tested} rows",
            "",
            *verdicts,
        ]
    return lines


def print_tables(summaries: dict[str, dict[int, dict[str, float]]], pairs: list[str] | None) -> None:
    """One difference table per ``A:B`` pair (each Holm-corrected over its own rows), or the
    table of all arms (with the difference of the first two, as before) without pairs."""
    if not pairs:
        print("\n" + "\n".join(difference_table(summaries)))
        return
    for pair in pairs:
        a, _, b = pair.partition(":")
        missing = [arm for arm in (a, b) if arm not in summaries]
        if missing:
            raise SystemExit(f"--pairs {pair}: no finished runs of arm(s) {', '.join(missing)}; arms: {', '.join(summaries)}")
        print(f"\n### {a} vs {b}\n\n" + "\n".join(difference_table({a: summaries[a], b: summaries[b]})))


def read_summary(path: Path) -> dict[str, dict[int, dict[str, float]]]:
    """The per-seed summaries of a ``summary.md`` this script wrote (its ``- <arm> seed <s>: …`` lines)."""
    import re

    summaries: dict[str, dict[int, dict[str, float]]] = {}
    names = None
    for line in path.read_text().splitlines():
        if line.startswith("| ") and not line.startswith(("| quantity", "|---")):
            names = (names or []) + [line.split("|")[1].strip()]
        match = re.match(r"^- (\S+) seed (\d+): steps \d+, (.*)$", line)
        if match is None:
            continue
        arm, seed, rest = match.group(1), int(match.group(2)), match.group(3)
        values: dict[str, float] = {}
        for name in sorted(names or [], key=len, reverse=True):  # longest first: names contain commas
            found = re.search(re.escape(name) + r" (-?[0-9.e+-]+)(?:,|$)", rest)
            if found:
                values[name] = float(found.group(1))
        summaries.setdefault(arm, {})[seed] = {name: values[name] for name in names or [] if name in values}
    return summaries


def band_plot(
    per_arm: dict[str, list[dict[str, list[tuple[int, float]]]]],
    keys: list[str],
    title: str,
    path: Path,
    *,
    target: float | None = None,
) -> None:
    figure, axis = plt.subplots(figsize=(6, 3.6))
    for arm, seeds in per_arm.items():
        for key in keys:
            steps, mean, low, high = curve_band([h[key] for h in seeds])
            label = arm if len(keys) == 1 else f"{arm}: {key.split('/')[-1]}"
            (line,) = axis.plot(steps, mean, marker="o", markersize=2, label=label)
            axis.fill_between(steps, low, high, alpha=0.2, color=line.get_color())
    if target is not None:
        axis.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target}")
    axis.set_title(title)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--target", type=float, default=0.5, help="the bapo arm's target_positive_share")
    parser.add_argument("--out", type=Path, default=None, help="folder for the two plots")
    parser.add_argument("--from-summary", type=Path, default=None, help="recompute the table from a summary.md's per-seed lines")
    parser.add_argument("--eval-key", default=EVAL_KEY, help="the held-out accuracy metric (eval/<suite>/accuracy)")
    parser.add_argument(
        "--pairs",
        nargs="+",
        default=None,
        metavar="A:B",
        help="arm pairs to difference, one table each, Holm over that table's rows (default: the first two arms)",
    )
    args = parser.parse_args()
    if args.from_summary is not None:
        print_tables(read_summary(args.from_summary), args.pairs)
        return
    client = make_client(args.tracking_uri)
    parent = find_parent_run(client, args.experiment)
    if parent is None:
        raise SystemExit(f"no experiment {args.experiment!r} in {args.tracking_uri}")
    histories: dict[str, list[dict[str, list[tuple[int, float]]]]] = {}
    summaries: dict[str, dict[int, dict[str, float]]] = {}
    for arm_run in find_arm_runs(client, parent.info.experiment_id, parent.info.run_id):
        arm = arm_run.data.tags[ARM_TAG]
        for seed_run in find_seed_runs(client, parent.info.experiment_id, arm_run.info.run_id):
            if seed_run.info.status != "FINISHED":  # a failed or unfinished seed's "final" values are not final
                print(f"left out: {arm} seed {seed_run.data.tags.get(SEED_TAG)} ({seed_run.info.status})")
                continue
            h = {key: history(client, seed_run.info.run_id, key) for key in (*KEYS, args.eval_key)}
            histories.setdefault(arm, []).append(h)
            summary = summarise(h, args.target, args.eval_key)
            summaries.setdefault(arm, {})[int(seed_run.data.tags.get(SEED_TAG, "0"))] = summary
            print(
                f"{arm} seed {seed_run.data.tags.get(SEED_TAG)}: steps {len(h['actor/entropy'])}, "
                + ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
            )
    print_tables(summaries, args.pairs)
    if args.out is not None and args.pairs:  # the whole course of each arm: entropy and the positive share at its own bounds
        args.out.mkdir(parents=True, exist_ok=True)
        band_plot(histories, ["actor/entropy"], f"{args.experiment}: entropy (actor/entropy)", args.out / "actor_entropy.png")
        band_plot(
            histories,
            ["actor/positive_share"],
            f"{args.experiment}: positive share at each objective's bounds",
            args.out / "actor_positive_share.png",
            target=args.target,
        )
        print(f"\nplots: {args.out}/actor_entropy.png, {args.out}/actor_positive_share.png")
    if args.out is not None and any(h["bapo/positive_share"] for seeds in histories.values() for h in seeds):
        args.out.mkdir(parents=True, exist_ok=True)
        band_plot(
            histories,
            ["bapo/positive_share"],
            f"{args.experiment}: positive share (bapo/positive_share)",
            args.out / "bapo_positive_share.png",
            target=args.target,
        )
        band_plot(histories, ["bapo/c_low", "bapo/c_high"], f"{args.experiment}: clip bounds", args.out / "bapo_clip_bounds.png")
        print(f"\nplots: {args.out}/bapo_positive_share.png, {args.out}/bapo_clip_bounds.png")


if __name__ == "__main__":
    main()
