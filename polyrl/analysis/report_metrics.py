"""What an experiment's comparison reads from MLflow and how it draws a curve: the metrics
compared, fetching their histories, and saving a plot. Shared by :mod:`polyrl.analysis.compare`
(one seed per arm) and :mod:`polyrl.analysis.seed_report` (arms over seeds); it sits below both,
so neither imports the other's internals.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

# Curves every comparison shows: (metric key, plot title).
CURVES: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("train/accuracy", "train accuracy"),
    ("rollout/response_length/mean", "mean response length (tokens)"),
    ("rollout/response_length/wrong_mean", "mean length of the wrong answers (tokens)"),
    ("actor/entropy", "entropy (nats/token)"),
)
TABLE_METRICS: tuple[str, ...] = (
    "reward/mean",
    "train/accuracy",
    "rollout/response_length/mean",
    "rollout/response_length/wrong_mean",
    "rollout/response_length/clipped_ratio",
    "actor/entropy",
    "actor/approx_kl",
    "actor/clip_frac_low",
    "actor/clip_frac_high",
    "actor/pos_loss_share",
    "actor/positive_share",
    # BAPO's adaptive clip bounds and the positive tokens' share of the loss (absent for other arms: no column)
    "bapo/c_low",
    "bapo/c_high",
    "bapo/positive_share",
    "rollout/logprob_gap",
    "perf/step_s",
)


def metric_histories(client: MlflowClient, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for key in keys:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        if points:
            out[key] = points
    return out


# arm -> metric -> seed -> [(step, value)]; the seed is None for an arm run of one seed (a report without seeds).
SeedHistories = dict[str, dict[str, dict[Any, list[tuple[int, float]]]]]


def finals(histories: SeedHistories, key: str) -> dict[str, dict[int, float]]:
    """Per arm, each seed's last logged value of ``key`` (seeds that never logged it are left out)."""
    return {
        arm: {seed: points[-1][1] for seed, points in by_key.get(key, {}).items() if points} for arm, by_key in histories.items()
    }


# Eval metrics worth a curve and a column; the rest stay in MLflow. Besides these, each reward
# module's own held-out mean (eval/<suite>/reward/<label>/mean): an experiment's headline is
# often one named reward (the drawing task's per-cell score), not the weighted total.
EVAL_HEADLINE_SUFFIXES = ("/accuracy", "/length/mean", "/length/wrong_mean", "/reward/mean", "/coco/CIDEr", "/cider_fast")
EVAL_REWARD_MEAN = re.compile(r"^eval/[^/]+/reward/[^/]+/mean$")


def logged_metric_keys(client: MlflowClient, run_ids: list[str]) -> list[str]:
    """Every metric key any of the runs logged."""
    keys: set[str] = set()
    for run_id in run_ids:
        keys.update(client.get_run(run_id).data.metrics)
    return sorted(keys)


def eval_headline_keys(logged: list[str]) -> list[str]:
    """Of the logged metric keys, the eval metrics worth a curve and a column."""
    return [
        k
        for k in logged
        if k.startswith("eval/") and (k.endswith(EVAL_HEADLINE_SUFFIXES) or "/pass_at_" in k or EVAL_REWARD_MEAN.match(k))
    ]


def eval_metric_keys(client: MlflowClient, run_ids: list[str]) -> list[str]:
    return eval_headline_keys(logged_metric_keys(client, run_ids))


def is_eval_score(key: str) -> bool:
    """Eval metrics compared between arms (differences with intervals): the scores, not lengths."""
    return key.startswith("eval/") and "/length/" not in key


# After the held-out scores and lengths: what a researcher comparing objectives reads.
HEADLINE_CURVES: tuple[str, ...] = ("rollout/response_length/mean", "reward/mean", "train/accuracy", "actor/entropy")


def headline_keys(eval_keys: list[str]) -> list[str]:
    """The metrics a comparison leads with — the parent run's metrics, the chart view's curves,
    the results document's columns: held-out scores (accuracies first), held-out lengths, then
    :data:`HEADLINE_CURVES`. A suite
    with an accuracy shows it alone: its per-reward means (``eval/<suite>/reward/…``) are what
    the accuracy already says, or a side term such as a length penalty."""
    with_accuracy = {key.rsplit("/", 1)[0] for key in eval_keys if key.endswith("/accuracy") and key.count("/") == 2}
    eval_keys = [
        key for key in eval_keys if not (key.split("/")[2:3] == ["reward"] and "/".join(key.split("/")[:2]) in with_accuracy)
    ]
    scores = sorted((key for key in eval_keys if is_eval_score(key)), key=lambda key: (not key.endswith("/accuracy"), key))
    lengths = [key for key in eval_keys if not is_eval_score(key)]
    return scores + lengths + list(HEADLINE_CURVES)


def safe_file_stem(key: str) -> str:
    """A metric key as a file name that stays inside the report folder (no '/', no '..')."""
    stem = re.sub(r"[^A-Za-z0-9_.\-]+", "_", key).strip(".")
    return stem or "metric"


def save_curve_plot(figure, axis, out: Path, key: str, *, legend_fontsize: float | None = None, xlabel: str = "step") -> Path:
    """Finish a curve plot of metric ``key`` (x-axis label, grid, legend) and write it as
    ``<out>/<key>.png``; the figure is closed."""
    axis.set_xlabel(xlabel)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_fontsize)
    figure.tight_layout()
    path = out / (safe_file_stem(key) + ".png")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
