"""``polyrl eval``: run models on an eval suite, log MLflow eval runs, write reports.

``eval_command`` is the typer command function; the main CLI mounts it as ``polyrl eval``.
``python -m polyrl.cli.evaluate --model ... --suite ...`` runs it on its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from polyrl.cli.errors import fail, user_errors

console = Console()


def _describe(error: BaseException) -> str:
    from polyrl.rewards import RewardModuleError

    if isinstance(error, RewardModuleError):  # a metric failed: say which, then why
        return f"metric {error.label or '?'!r} failed: {error}"
    return str(error)


def _fmt(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def eval_command(
    model: list[str] = typer.Option(
        ..., "--model", "-m", help="Model folder, run:<run_id> (latest checkpoint) or run:<run_id>@<step>. Repeat to compare."
    ),
    suite: str = typer.Option(..., "--suite", "-s", help="Suite name (experiments/evals/<name>.yaml) or a YAML path."),
    engine: str = typer.Option("vllm", "--engine", help="Rollout engine: vllm or hf."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most N prompts per dataset (caps the suite's limit)."),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        help="Report folder; default reports/eval/<suite>/<model-slug> (several models: the folder holding one per model and comparison.md).",
    ),
    experiment: str = typer.Option("polyrl-eval", "--experiment", help="MLflow experiment of the eval runs."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Where run checkpoints are exported as model folders; default $POLYRL_CACHE/eval-exports."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="Engine dtype."),
    max_model_len: int = typer.Option(512, "--max-model-len", min=1, help="Longest prompt + completion (vLLM)."),
    kv_cache_gb: float = typer.Option(1.0, "--kv-cache-gb", min=0.01, help="vLLM KV cache size."),
    env: Optional[str] = typer.Option(
        None, "--env", help="Play the suite's prompts as episodes with this environment (name, file.py:Class, module:Class)."
    ),
    env_params: str = typer.Option("{}", "--env-params", help="The environment's parameters as a JSON object (with --env)."),
    max_turns: Optional[int] = typer.Option(
        None, "--max-turns", min=1, help="Assistant turns per episode (with --env; default 4)."
    ),
    max_episode_tokens: Optional[int] = typer.Option(
        None, "--max-episode-tokens", min=1, help="Tokens per episode after its first prompt (with --env; default 512)."
    ),
    env_stop: list[str] = typer.Option([], "--env-stop", help="A string that also ends an assistant turn (repeatable)."),
) -> None:
    """Evaluate one or more models on an eval suite; log MLflow eval runs and write reports."""
    if env is None:
        # Each of these would be ignored (said before the slow imports below) without an environment to play.
        given = [name for name, value in (("--env-params", env_params != "{}"), ("--env-stop", bool(env_stop)),
                 ("--max-turns", max_turns is not None), ("--max-episode-tokens", max_episode_tokens is not None)) if value]  # fmt: skip
        if given:
            fail(f"{', '.join(given)}: apply only with --env (episodes); add --env NAME or remove them")
    from polyrl.engines.base import ROLLOUT_ENGINES
    from polyrl.evals.evaluate import EngineOptions, evaluate_models

    if engine not in ROLLOUT_ENGINES:
        fail(f"--engine {engine!r}: allowed: {', '.join(sorted(ROLLOUT_ENGINES))}")

    def on_model(resolved, result, folder) -> None:
        console.print(
            f"[green]done[/] [cyan]{resolved.slug}[/] ({resolved.ref}): {result.datasets} in {result.seconds:.1f} s → {folder}"
        )

    episodes = None
    if env is not None:
        import json

        from polyrl.evals.episodes import EpisodeOptions

        try:
            params = json.loads(env_params)
        except json.JSONDecodeError as error:
            fail(f"--env-params {env_params!r} is not valid JSON ({error})")
        if not isinstance(params, dict):
            fail(f"--env-params {env_params!r} must be a JSON object")
        if "" in env_stop:
            fail("--env-stop '': an empty stop string would end every turn after its first token; remove it")
        episodes = EpisodeOptions(env, params, max_turns or 4, max_episode_tokens or 512, stop=tuple(env_stop))
    with user_errors(_describe):
        outcome = evaluate_models(
            list(model),
            suite,
            engine=EngineOptions(engine, dtype, max_model_len, kv_cache_gb),
            limit=limit,
            out=out,
            experiment=experiment,
            tracking_uri=tracking_uri,
            cache_dir=cache_dir,
            on_model=on_model,
            episodes=episodes,
        )
    table = Table(title=f"eval {outcome.reports[0]['suite']}")
    table.add_column("metric")
    for report in outcome.reports:
        table.add_column(report["model"]["slug"], justify="right")
    for name in sorted({k for r in outcome.reports for k in r["metrics"]}):
        table.add_row(name, *(_fmt(r["metrics"].get(name)) for r in outcome.reports))
    console.print(table)
    for report, folder in zip(outcome.reports, outcome.report_dirs):
        console.print(f"report: {folder / 'report.md'} · MLflow eval run {report['mlflow_run_id']} ({report['tracking_uri']})")
    if outcome.comparison:
        console.print(f"comparison: {outcome.comparison[1]} and {outcome.comparison[0].name}")


def main() -> None:  # pragma: no cover - exercised through a subprocess in the tests
    typer.run(eval_command)


if __name__ == "__main__":  # pragma: no cover
    main()
