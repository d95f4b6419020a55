"""``polyrl eval`` without the command line: evaluate models on a suite, log and report.

For each model: an MLflow eval run (experiment ``polyrl-eval`` by default) tagged with what it
evaluates, the suite run through a fresh rollout engine, metrics + per-sample table + report
logged to the run, and ``report.json`` / ``report.md`` / ``samples.jsonl`` written atomically
to the model's report folder. The per-example outcomes (``eval_examples/<suite>/step_<n>.jsonl``)
go to the eval run and, for a training run's checkpoint, to that run too. Several models also get one side-by-side comparison.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from polyrl.evals.example_outcomes import POLYRL_EVAL_SUFFIX, example_files
from polyrl.evals.harness import EvalResult, SuiteRunner
from polyrl.evals.models import ResolvedModel, resolve_model
from polyrl.evals.report import report_files, write_atomic_dir, write_comparison
from polyrl.tracking.sample_html import has_images, samples_html

DEFAULT_EXPERIMENT = "polyrl-eval"
EVALUATES_RUN_TAG = "polyrl.evaluates_run"
MODEL_TAG = "polyrl.model"
SUITE_TAG = "polyrl.suite"
ROLE_TAG = "polyrl.role"
# Image suites: the per-sample table with the prompt images (MLflow artifact and report file).
SAMPLES_HTML = "samples.html"


@dataclass
class EngineOptions:
    engine: str = "vllm"
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_gb: float = 1.0


@dataclass
class EvalOutcome:
    reports: list[dict[str, Any]]
    report_dirs: list[Path]
    comparison: tuple[Path, Path] | None = None
    results: list[EvalResult] = field(default_factory=list)


def default_out_dir(suite_name: str) -> Path:
    return Path("reports") / "eval" / suite_name


def _unique_slugs(models: list[ResolvedModel]) -> None:
    seen: dict[str, int] = {}
    for model in models:
        count = seen.get(model.slug, 0)
        seen[model.slug] = count + 1
        if count:
            model.slug = f"{model.slug}-{count + 1}"


def evaluate_models(
    model_refs: list[str],
    suite: str | Path,
    *,
    engine: EngineOptions | None = None,
    limit: int | None = None,
    out: str | Path | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    tracking_uri: str | None = None,
    cache_dir: str | Path | None = None,
    on_model: Callable[[ResolvedModel, EvalResult, Path], None] | None = None,
    episodes: Any = None,
) -> EvalOutcome:
    """Evaluate every model on ``suite``.

    ``out``: with one model, that model's report folder (default ``reports/eval/<suite>/<slug>``);
    with several, the folder holding one ``<slug>/`` per model and ``comparison.{md,json}``.
    ``episodes`` (:class:`polyrl.evals.episodes.EpisodeOptions`, ``--env``): the suite's prompts
    are played as episodes with that environment (:mod:`polyrl.evals.episodes`).
    """
    from polyrl.tracking.mlflow_runs import ensure_experiment, make_client, probe_tracking, resolve_tracking_uri

    if not model_refs:
        raise ValueError("evaluate_models needs at least one model")
    engine = engine or EngineOptions()
    uri = resolve_tracking_uri(tracking_uri)
    # A server that does not answer is one message in seconds, not MLflow's retries after the models are exported.
    probe_tracking(uri, setting="--tracking-uri", nothing_done="nothing was evaluated or logged")
    # Resolve every model and load the suite before starting any engine: bad input fails fast.
    models = [resolve_model(ref, tracking_uri=uri, cache_dir=cache_dir) for ref in model_refs]
    _unique_slugs(models)
    runner = SuiteRunner(suite, limit=limit)
    if episodes is not None:
        runner = _as_episodes(runner, episodes, engine, None)
    runners = {None: runner}  # keyed by a run model's chat format (None: the suite's own settings)
    for model in models:
        runner.check_model(model.path, field="--model" if model.ref == str(model.path) else f"--model {model.ref!r}, exported to")
    base = Path(out) if out is not None else default_out_dir(runner.suite.name)
    client = make_client(uri)
    experiment_id = ensure_experiment(client, experiment, tracking_uri=uri)
    outcome = EvalOutcome([], [])
    for model in models:
        folder = base if (out is not None and len(models) == 1) else base / model.slug
        # A run's model reads the suite's prompts as its training prompts were formatted (evals/models.py).
        if model.chat not in runners:  # one runner per distinct chat format: the suite's prompts are read once for each
            own = SuiteRunner(suite, limit=limit, chat=model.chat)
            runners[model.chat] = own if episodes is None else _as_episodes(own, episodes, engine, model.chat)
        own = runners[model.chat]
        report, result = _evaluate_one(model, own, engine, client, experiment_id, uri, folder, limit)
        outcome.reports.append(report)
        outcome.report_dirs.append(folder)
        outcome.results.append(result)
        if on_model is not None:
            on_model(model, result, folder)
    if len(models) > 1:
        outcome.comparison = write_comparison(base, outcome.reports)
    return outcome


def _as_episodes(runner: SuiteRunner, episodes: Any, engine: EngineOptions, chat: Any) -> Any:
    from polyrl.evals.episodes import EpisodeSuiteRunner

    system_prompt = getattr(chat, "system_prompt", None)  # a run's model: its training system prompt
    return EpisodeSuiteRunner(runner, episodes.runner_factory(max_model_len=engine.max_model_len, system_prompt=system_prompt))


def _evaluate_one(
    model: ResolvedModel,
    runner: Any,  # a SuiteRunner, or an EpisodeSuiteRunner with --env
    options: EngineOptions,
    client,
    experiment_id: str,
    uri: str,
    folder: Path,
    limit: int | None,
) -> tuple[dict[str, Any], EvalResult]:
    from polyrl.engines.base import build_rollout_engine
    from polyrl.tracking.mlflow_runs import RunLogger

    suite = runner.suite
    tags = {
        MODEL_TAG: model.ref,
        SUITE_TAG: suite.name,
        ROLE_TAG: "eval",
        "polyrl.engine": options.engine,
        "polyrl.model_path": str(model.path),
    }
    if model.run_id:
        tags[EVALUATES_RUN_TAG] = model.run_id
        tags["polyrl.checkpoint_step"] = str(model.step)
    run = client.create_run(experiment_id, run_name=f"{suite.name}:{model.slug}", tags=tags)
    logger = RunLogger(client, run.info.run_id)
    try:
        logger.log_params(
            {
                "suite": suite.name,
                "engine": options.engine,
                "dtype": options.dtype,
                "limit": limit,
                **{f"generation.{k}": v for k, v in suite.generation.model_dump().items()},
            }
        )
        logger.log_text(yaml.safe_dump(suite.model_dump(mode="json"), sort_keys=False), "suite.yaml")
        started = time.time()
        rollout = build_rollout_engine(
            options.engine,
            str(model.path),
            seed=suite.generation.seed,
            dtype=options.dtype,
            max_model_len=options.max_model_len,
            kv_cache_gb=options.kv_cache_gb,
        )
        try:
            result = runner.run(rollout)
        finally:
            rollout.close()
        report = _report(model, suite, options, result, run.info.run_id, uri, time.time() - started, limit)
        files = report_files(report, result.rows)
        logger.log_metrics(model.step or 0, result.metrics)
        logger.log_table(result.rows, "samples.json")
        _log_example_outcomes(client, logger, model, result, run.info.run_id)
        for name, text in files.items():
            logger.log_text(text, f"report/{name}")
        episodes = any("episode" in row for row in result.rows)  # shown turn by turn
        if len(result.row_images) == len(result.rows) and (has_images(result.row_images) or episodes):
            # Beside samples.json, where the MLflow artifact viewer shows it next to the text table.
            files[SAMPLES_HTML] = samples_html(result.rows, result.row_images, title=f"{suite.name}: {model.ref}")
            logger.log_text(files[SAMPLES_HTML], SAMPLES_HTML)
        # Last: the report folder changes only once everything above succeeded.
        write_atomic_dir(folder, files)
    except BaseException as error:
        logger.set_tags({"polyrl.error": f"{type(error).__name__}: {error}"[:5000]})
        logger.finish("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        raise
    logger.finish()
    return report, result


def _log_example_outcomes(client, logger, model: ResolvedModel, result: EvalResult, eval_run_id: str) -> None:
    """The per-example outcomes (:mod:`polyrl.evals.example_outcomes`) in the eval run; for a
    training run's checkpoint also in that run (``step_<n>.polyrl-eval.jsonl``, its rows
    pointing at this eval run's sample table), where ``polyrl compare`` finds them."""
    from polyrl.tracking.mlflow_runs import ARM_TAG, SEED_TAG

    tags = client.get_run(model.run_id).data.tags if model.run_id else {}
    arm, seed = tags.get(ARM_TAG), tags.get(SEED_TAG)
    step = model.step or 0
    who = {"arm": arm, "seed": None if seed is None else int(seed), "step": step}
    for name, text in example_files(result, **who, samples_file="samples.json").items():
        logger.log_text(text, name)
    if model.run_id:
        samples_file = f"runs:/{eval_run_id}/samples.json"
        for name, text in example_files(result, **who, samples_file=samples_file, suffix=POLYRL_EVAL_SUFFIX).items():
            client.log_text(model.run_id, text, name)


def _report(
    model: ResolvedModel,
    suite,
    options: EngineOptions,
    result: EvalResult,
    run_id: str,
    uri: str,
    seconds: float,
    limit: int | None,
) -> dict[str, Any]:
    return {
        "suite": suite.name,
        "kind": suite.kind,
        "model": {"ref": model.ref, "path": str(model.path), "slug": model.slug, "run_id": model.run_id, "step": model.step},
        "engine": options.engine,
        "generation": suite.generation.model_dump(),
        "limit": limit,
        "datasets": result.datasets,
        "metrics": result.metrics,
        "seconds": seconds,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mlflow_run_id": run_id,
        "tracking_uri": uri,
    }
