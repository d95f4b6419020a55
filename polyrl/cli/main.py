"""The ``polyrl`` command line.

Every user-facing failure (a bad YAML, a missing model, an unknown experiment) is reported
as one clear message and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import functools
import inspect
import os
import shlex
import subprocess
import sys
import webbrowser
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from polyrl.launch.logs import LOG_FILE, command_logging, eval_log_path, experiment_log_path, quiet_library_environment

# The CLI shows its own lines; the libraries' logs go to <run folder>/polyrl.log (launch/logs.py),
# so they must not install their own terminal handlers when they are imported.
quiet_library_environment()
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# MLflow's usage telemetry runs a background client that sets and unsets an environment
# variable while the main thread may be iterating os.environ (requests does on every call to a
# tracking server): `polyrl run` against a `mlflow server` died with KeyError
# '_MLFLOW_TELEMETRY_SESSION_ID'. Off by default (machines are often offline); the user's setting wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# polyrl compare reads every seed run's per-example file; a progress bar per file buries its output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from polyrl.cli.calibrate import calibrate_command
from polyrl.cli.envs import app as envs_app
from polyrl.cli.errors import user_errors
from polyrl.cli.evaluate import eval_command
from polyrl.cli.export import export_command
from polyrl.cli.objectives import app as objectives_app
from polyrl.cli.plan import plan_command
from polyrl.cli.replay import replay_command
from polyrl.cli.rewards import app as rewards_app
from polyrl.cli.scale import scale_model_command
from polyrl.cli.submit import MANY_RUNS_HELP, jobs_app, submit_command

app = typer.Typer(
    help="polyrl: reinforcement-learning experiments on language and vision-language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(objectives_app, name="objectives")
app.add_typer(rewards_app, name="rewards")
app.add_typer(envs_app, name="envs")
app.add_typer(jobs_app, name="jobs")
console = Console()

VERBOSE_HELP = f"Also show vLLM's, transformers' and other libraries' logs here (always written to {LOG_FILE} in the run folder)."


def with_verbose(command, log_path_of):
    """``command`` with a ``--verbose`` option; the libraries' output goes to ``log_path_of(arguments)``."""
    signature = inspect.signature(command)
    verbose = inspect.Parameter(
        "verbose",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=bool,
        default=typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
    )

    @functools.wraps(command)
    def wrapper(*args, verbose: bool = False, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        with user_errors():
            log_path = log_path_of(arguments)
            with command_logging(log_path, verbose=verbose, command=shlex.join(sys.argv)):
                return command(**arguments)

    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), verbose])
    return wrapper


app.command(
    "submit", help="Run an experiment's arms as Ray tasks on a local Ray, or (--address) submit it as a Ray job to a cluster."
)(with_verbose(submit_command, lambda a: experiment_log_path(a["config"], a.get("set_"))))
app.command(
    "scale-model", help="Predict step time, samples/s and speed-up on many devices from one step's measured phase times."
)(scale_model_command)
app.command(
    "export", help="Write a checkpoint (run:<id>[@step], step_N or arm folder) as a Hugging Face model folder; LoRA runs merged."
)(export_command)
app.command("plan", help="Seeds needed to settle a comparison (fixed and sequential) and the wall time, from an sd or a pilot.")(
    plan_command
)
app.command(
    "calibrate", help="A/A check: how often compare calls two halves of one arm's seed runs different (each such call is false)."
)(calibrate_command)
app.command("replay", help="Re-score a run's stored groups under other rewards, weights or aggregation; no policy loaded.")(
    replay_command
)
app.command("eval", help="Evaluate one or more models (folders or MLflow runs) on an eval suite.")(
    with_verbose(eval_command, lambda a: eval_log_path(a["suite"], a.get("out")))
)


@app.command()
def validate(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set train.steps=5 (repeatable)."),
) -> None:
    """Check an experiment YAML without running it; print each arm's resolved key settings."""
    from polyrl.config.seeds import experiment_seeds, seeds_at_once_setting
    from polyrl.config.until_resolved import until_resolved_plan
    from polyrl.launch.preflight import preflight
    from polyrl.launch.run_units import MANY_RUNS, plan_line, run_count
    from polyrl.launch.runner import read_yaml, validate_file
    from polyrl.launch.units_at_once import resolve_at_once, side_by_side_line

    with user_errors():
        arms = validate_file(config, set_)
        preflight(arms, source=str(config), echo=lambda line: console.print(line, highlight=False))
        raw = read_yaml(config)
        seeds = experiment_seeds(raw, source=str(config))
        rounds = until_resolved_plan(raw, list(arms), source=str(config))
        at_once, why = resolve_at_once(
            seeds_at_once_setting(raw, source=str(config)), arms, rounds.seeds() if rounds is not None else seeds
        )
    if rounds is None:
        console.print(f"runs: {plan_line(arms, seeds)}", highlight=False)
    else:
        console.print(
            f"runs: until resolved, rounds of {rounds.seeds_per_round} seed(s) per arm up to {rounds.max_seeds} "
            f"(at most {plan_line(arms, rounds.seeds())})",
            highlight=False,
        )
        for comparison in rounds.comparisons:
            a, b = comparison.arms
            console.print(
                f"  compare {a} − {b} on {comparison.metric} ({'higher' if comparison.higher_is_better else 'lower'} is better, "
                f"smallest effect of interest {comparison.sesoi:g})",
                highlight=False,
            )
    if at_once > 1:
        console.print(side_by_side_line(at_once, why), highlight=False)
    if run_count(arms, seeds) > MANY_RUNS:
        console.print(
            f"[yellow]more than {MANY_RUNS} runs[/]: seeds: N means N runs of every arm (did you mean seed: N?); "
            "polyrl run and submit start them only with --many-runs",
            highlight=False,
        )
    for arm, cfg in arms.items():
        console.print(
            f"[green]ok[/] arm [cyan]{arm}[/]: objective={cfg.objective.name} "
            f"loss_aggregation={cfg.objective.aggregation or 'default'} engine={cfg.rollout.engine} "
            f"steps={cfg.train.steps} prompts×samples={cfg.rollout.prompts_per_step}×{cfg.rollout.samples_per_prompt} "
            + (f"env={cfg.env.module} (reward: the episode's return)" if cfg.env else _rewards_words(cfg))
            + (f" teacher={_teacher_words(cfg.distill)}" if cfg.distill else "")
        )


def _rewards_words(cfg: Any) -> str:
    """The arm's rewards, and how several reach the advantage (arms that differ only there must read differently)."""
    words = f"rewards={[s.module for s in cfg.rewards]}"
    if len(cfg.rewards) > 1:
        words += f" combined by {cfg.advantage.reward_aggregation}"
    return words


def _teacher_words(distill: Any) -> str:
    """``distill.teacher`` as written (path, built-in or run), with the term's weight and whether the task reward trains."""
    teacher = distill.teacher
    named = teacher.path or teacher.run or (teacher.builtin.name if teacher.builtin and teacher.builtin.name else "builtin")
    return f"{named} (coef {distill.coef:g}{', task reward too' if distill.task_reward else ', pure distillation'})"


@app.command()
def run(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set train.steps=5 (repeatable)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the last run of this experiment from its checkpoints, in the same MLflow runs."
    ),
    arm: list[str] = typer.Option([], "--arm", help="Run only these arms (repeatable)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Plain log lines instead of a progress bar."),
    allow_config_change: bool = typer.Option(
        False,
        "--allow-config-change",
        help="With --resume: apply a changed config from the next step (recorded in MLflow) "
        "instead of refusing it; model, data, seed and tracking changes stay refused.",
    ),
    seeds: Optional[str] = typer.Option(
        None,
        "--seeds",
        help="Run every arm with these seeds: a count (--seeds 3 = 0,1,2) or a list "
        "(--seeds 0,1,2); overrides the YAML's seeds and seed.",
    ),
    many_runs: bool = typer.Option(False, "--many-runs", help=MANY_RUNS_HELP),
    fail_fast: bool = typer.Option(
        False,
        "--fail-fast",
        help="Stop at the first arm that fails (default: run the other arms, then name every failed one and exit 1).",
    ),
    seeds_at_once: Optional[str] = typer.Option(
        None,
        "--seeds-at-once",
        help="Seed runs trained side by side, each in its own process with its share of the cores: a number, or auto "
        "(two on a CPU-only machine of 2+ cores); overrides the YAML's seeds_at_once.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Run every arm of an experiment and log it to MLflow."""
    from polyrl.launch.preflight import preflight_file
    from polyrl.launch.runner import ArmFailedError, run_experiment

    with user_errors():
        # Rewards, model folder and data are checked before any MLflow run or model exists.
        preflight_file(
            config, set_options=set_, only_arms=arm, runs_here=True, echo=lambda line: console.print(line, highlight=False)
        )
        log_path = experiment_log_path(config, set_)
        if not verbose:
            console.print(f"library logs: {log_path} (--verbose shows them here)", highlight=False)
        with command_logging(log_path, verbose=verbose, command=shlex.join(sys.argv)):
            try:
                result = run_experiment(
                    config,
                    set_options=set_,
                    resume=resume,
                    only_arms=arm or None,
                    console=console,
                    show_progress=False if no_progress else None,
                    allow_config_change=allow_config_change,
                    seeds_option=seeds,
                    fail_fast=fail_fast,
                    many_runs=many_runs,
                    seeds_at_once=seeds_at_once,
                    verbose=verbose,
                )
            except ArmFailedError as error:
                if error.result is not None:  # the arms that finished are reported before the failed ones
                    _print_summary(error.result)
                raise
    _print_summary(result)


def _print_summary(result) -> None:
    from polyrl.launch.arm_runs import summary_line

    for name, metrics in result.final_metrics.items():
        console.print(summary_line(name, metrics))
    console.print(f"MLflow: {result.tracking_uri} (parent run {result.parent_run_id})")
    console.print(f"Compare the arms: polyrl compare {result.name}    ·    in the MLflow UI: polyrl ui {result.name} --open")


@app.command()
def compare(
    experiment: str = typer.Argument(..., help="Experiment name (the YAML's `name`)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder; default reports/<experiment>."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."),
    results: Optional[Path] = typer.Option(
        None,
        "--results",
        help="Also write the experiment's section of this results document (e.g. docs/results.md), replacing only that section.",
    ),
    baseline: Optional[str] = typer.Option(
        None,
        "--baseline",
        help="An arm to compare every other arm with (differences arm − baseline, Holm-corrected over those only); "
        "default: every pair of arms.",
    ),
    metrics: Optional[str] = typer.Option(
        None,
        "--metrics",
        help="Comma-separated metric keys to compare (e.g. eval/arithmetic_chat/accuracy,eval/arithmetic_chat/length/mean); "
        "default: the held-out scores and the training curves.",
    ),
    axis: str = typer.Option(
        "step",
        "--axis",
        help="What arms are compared at: step, tokens (generated), flops (learner) or seconds (training steps' wall time). "
        "On tokens|flops|seconds the curves are drawn against that cumulative counter (compute/*) and final values are "
        "taken at the most of it every run reached, for arms that do different work per step (DAPO refills, ReMax, "
        "async, other samples_per_prompt); runs without the counters can be compared by step only.",
    ),
) -> None:
    """Plot the arms of an experiment side by side and tabulate their final values."""
    from polyrl.analysis.compare import CompareError, compare_experiment, default_report_dir
    from polyrl.tracking.mlflow_runs import is_server_uri, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    with user_errors():
        out = out or default_report_dir(experiment)
        chosen = [key.strip() for key in metrics.split(",") if key.strip()] if metrics is not None else None
        if metrics is not None and not chosen:
            raise CompareError("--metrics: no metric key given (comma-separated keys, e.g. eval/<suite>/accuracy)")
        result = compare_experiment(experiment, tracking_uri=uri, out_dir=out, baseline=baseline, metrics=chosen, axis=axis)
        if results is not None:
            from polyrl.analysis.results_doc import write_results
            from polyrl.tracking.mlflow_runs import make_client

            write_results(results, make_client(uri), result)
    for status in result.statuses or []:
        colour = "green" if status.finished else "red"
        console.print(f"[{colour}]{status.arm}[/]: {escape(status.describe())}", highlight=False, soft_wrap=True)
    from polyrl.analysis.console_summary import console_summary

    for renderable in console_summary(result):  # verdicts and headline figures; the full table is in report.md
        console.print(renderable, highlight=False)
    if result.budget is not None:
        from polyrl.analysis.compare_axis import AXES

        console.print(
            f"Final values and differences at {result.budget:.3g} {AXES[result.axis].label}, the most every run reached "
            "(each run's last logged point at or before it; the report says at which step).",
            highlight=False,
        )
    console.print(
        f"\nReport: {result.out_dir / 'report.md'} ({len(result.plot_paths)} plots), also logged to parent run "
        f"{result.parent_run_id} and shown as its description in the MLflow UI."
    )
    if results is not None:
        console.print(f"Results: section {experiment!r} of {results} (plots in {results.parent / 'results'})", highlight=False)
    console.print(
        f"Compare the arms in MLflow ({'step curves' if result.axis == 'step' else 'curves against its compute counter'}, "
        "one line per arm): "
        f"{result.compare_url}",
        soft_wrap=True,
        highlight=False,
    )
    if not is_server_uri(uri):
        console.print(f"(a local store: start the UI first with polyrl ui {experiment})", highlight=False)
    if baseline is None and result.seed_runs and len(result.arms) > 4:
        console.print(
            f"({len(result.arms)} arms: every pair is compared; --baseline ARM compares each arm with one arm only, "
            "which keeps Holm's correction to fewer comparisons)",
            highlight=False,
        )
    if result.unfinished:
        from polyrl.cli.errors import fail

        fail(f"{result.unfinished} (the report says so too)", code=1)


@app.command()
def ui(
    experiment: Optional[str] = typer.Argument(
        None, help="Experiment name: print (and with --open, open) the chart view of its arms."
    ),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; loopback by default."),
    port: int = typer.Option(5000, help="Port."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."),
    open_browser: bool = typer.Option(False, "--open", help="Open the URL in a web browser."),
) -> None:
    """Start the MLflow UI on the experiment store (127.0.0.1 by default), or, for a tracking
    server, point at it; with EXPERIMENT, the URL of the chart view of its arms (step curves,
    one line per arm: the mean over its seeds)."""
    from polyrl.analysis.compare import experiment_compare_url
    from polyrl.tracking.mlflow_runs import is_server_uri, resolve_tracking_uri
    from polyrl.tracking.ui_links import ui_base_url

    uri = resolve_tracking_uri(tracking_uri)
    base = ui_base_url(uri, host=host, port=port)
    url = base
    if experiment:
        with user_errors():
            url = experiment_compare_url(experiment, tracking_uri=uri, base_url=base)
    console.print(f"MLflow UI for {uri}:\n{url}", soft_wrap=True, highlight=False)
    if is_server_uri(uri):  # a server already serves its UI
        if open_browser:
            webbrowser.open(url)
        return
    console.print(f"Serving it on http://{host}:{port} (Ctrl-C to stop)")
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    command = [
        str(mlflow_bin) if mlflow_bin.exists() else "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
    ]
    server = subprocess.Popen(command, env=os.environ.copy())
    if open_browser:
        _open_when_up(f"http://{host}:{port}", url, server)
    raise typer.Exit(server.wait())


def _open_when_up(base: str, url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):
                webbrowser.open(url)
                return
        except OSError:
            time.sleep(0.5)
    console.print(f"the UI did not answer within {timeout_s:g} s; open {url} yourself")


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
