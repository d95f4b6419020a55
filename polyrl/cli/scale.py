"""``polyrl scale-model``: the schedule model of :mod:`polyrl.analysis.schedule_model` as a table.

The phase times come from an MLflow run (``--run``: the mean of its ``perf/<phase>_s`` over the
steps after the first, which carries the engines' warm-up) or from a JSON file (``--times``:
``{"generate": s, "score": s, "logprobs": s, "update": s, "sync": s, "log": s, "prompts": n,
"samples": n}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from polyrl.analysis.schedule_model import Cluster, PhaseTimes, Prediction, best_layouts, predict
from polyrl.cli.errors import user_errors
from polyrl.config.schema import ConfigError

_console = Console()

# polyrl's phases (trainer/loop.py PHASES) → the model's; "advantage" computes the old/reference log-probs.
RUN_PHASES = {"generate": "generate", "score": "score", "logprobs": "advantage", "update": "update", "sync": "sync", "log": "log"}


def times_from_run(run_id: str, tracking_uri: str | None = None) -> PhaseTimes:
    """A run's mean phase times per step (the first step left out when there are more)."""
    from polyrl.tracking.mlflow_runs import make_client, resolve_tracking_uri

    client = make_client(resolve_tracking_uri(tracking_uri))
    try:
        run = client.get_run(run_id)
    except Exception as error:  # noqa: BLE001 - MLflow's own exception for an unknown id
        raise ConfigError(
            f"--run {run_id}: no such MLflow run in {resolve_tracking_uri(tracking_uri)} ({type(error).__name__})"
        ) from None

    def mean(key: str) -> float:
        values = [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
        if not values:
            raise ConfigError(f"--run {run_id}: the run has no {key} (a polyrl training run logs perf/<phase>_s every step)")
        return sum(values[1:] or values) / len(values[1:] or values)

    prompts = run.data.params.get("rollout.prompts_per_step")
    if prompts is None:
        raise ConfigError(f"--run {run_id}: the run has no param rollout.prompts_per_step (is it a polyrl arm run?)")
    seconds = {name: mean(f"perf/{phase}_s") for name, phase in RUN_PHASES.items()}
    return PhaseTimes(**seconds, prompts=int(prompts), samples=round(mean("rollout/samples")))


def times_from_json(path: Path) -> PhaseTimes:
    try:
        data = json.loads(path.read_text())
        return PhaseTimes(**data)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError(
            f"--times {path}: {error} (expected generate, score, logprobs, update, sync, log seconds and prompts, samples counts)"
        ) from None


def prediction_rows(predictions: list[Prediction]) -> Table:
    table = Table(
        "devices", "k", "engines", "ranks", "placement", "step s", "samples/s", "speed-up", "learner waits", "buffer", "comm."
    )
    for p in predictions:
        c = p.cluster
        table.add_row(
            str(p.devices),
            str(c.staleness),
            str(c.workers),
            str(c.learner_ranks),
            "shared" if c.colocated else "own",
            f"{p.step_s:.4g}",
            f"{p.samples_per_s:.4g}",
            f"{p.speedup:.2f}×",
            f"{p.learner_wait_s / p.step_s:.0%}",
            "-" if p.buffer_utilisation is None else f"{p.buffer_utilisation:.0%}",
            f"{p.communication_share:.1%}",
        )
    return table


def scale_model_command(
    run: Optional[str] = typer.Option(None, "--run", help="MLflow run id whose perf/<phase>_s give the one-device phase times."),
    times: Optional[Path] = typer.Option(None, "--times", help="JSON file of phase times (instead of --run)."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."),
    devices: str = typer.Option(
        "1,2,4,8",
        "--devices",
        help="Device counts to compare (comma-separated): synchronous with an engine "
        "and a rank per device, and the fastest asynchronous (k=1) split of engines and ranks.",
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="Predict one layout instead: rollout workers."),
    ranks: int = typer.Option(1, "--ranks", help="With --workers: learner ranks."),
    staleness: int = typer.Option(0, "--staleness", help="With --workers: rollout.max_staleness (0 synchronous)."),
    colocated: bool = typer.Option(
        False, "--colocated/--separate", help="With --workers: engines on the ranks' devices or their own."
    ),
    weight_gb: float = typer.Option(
        0.0, "--weight-gb", help="GB of weights sent to the engines after an update (bf16: 2 × params)."
    ),
    gradient_gb: Optional[float] = typer.Option(
        None, "--gradient-gb", help="GB all-reduced per optimizer step (default --weight-gb)."
    ),
    bandwidth: float = typer.Option(
        25.0, "--bandwidth-gb-s", help="GB/s between devices (PCIe 4 ~25, NVLink ~250, 100 Gb/s IB ~12)."
    ),
    optimizer_steps: int = typer.Option(1, "--optimizer-steps", help="All-reduces per training step (epochs × mini-batches)."),
) -> None:
    """Predict step time, samples/s, speed-up, buffer utilisation and communication share on many devices."""
    with user_errors():
        if (run is None) == (times is None):
            raise ConfigError("give the measured phase times with exactly one of --run RUN_ID or --times FILE.json")
        phase_times = times_from_run(run, tracking_uri) if run else times_from_json(times)
        links = {
            "weight_bytes": weight_gb * 1e9,
            "gradient_bytes": None if gradient_gb is None else gradient_gb * 1e9,
            "bandwidth_gb_s": bandwidth,
            "optimizer_steps": optimizer_steps,
        }
        try:
            if workers is not None:
                cluster = Cluster(workers=workers, learner_ranks=ranks, staleness=staleness, colocated=colocated, **links)
                rows = [predict(phase_times, cluster)]
            else:
                counts = [int(n) for n in devices.split(",") if n.strip()]
                rows = [p for n in counts for p in best_layouts(phase_times, n, **links).values()]
        except ValueError as error:
            raise ConfigError(str(error)) from None
    t = phase_times
    _console.print(
        f"one device, per step: generate {t.generate:.4g} s, score {t.score:.4g} s, log-probs {t.logprobs:.4g} s, "
        f"update {t.update:.4g} s, sync {t.sync:.4g} s, log {t.log:.4g} s = {t.one_device_step_s:.4g} s for "
        f"{t.samples} samples ({t.prompts} prompts)",
        highlight=False,
    )
    Console(width=max(_console.width, 120)).print(prediction_rows(rows))  # piped output too gets the whole table
    _console.print(
        "k: staleness (0 synchronous) · placement: engines on the ranks' devices (shared) or their own · learner waits: "
        "share of the step the learner waits for a batch · buffer: batches ready when the learner asks, over k · comm.: "
        "all-reduce + weight broadcast share of the step",
        highlight=False,
    )
