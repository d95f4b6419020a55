"""What ``--model`` names: a Hugging Face model folder, or a training run's checkpoint.

- ``PATH`` — a local model folder (``config.json`` + weights + tokenizer);
- ``run:<run_id>`` — the latest complete checkpoint of a training arm run;
- ``run:<run_id>@<step>`` — that run's checkpoint at ``step``.

A run's checkpoints are found through its ``polyrl.checkpoint_dir`` tag and exported once
(:func:`polyrl.platform.checkpoint.export_model_dir`) into ``<cache>/eval-exports/<run>/step_<n>``;
later evals of the same checkpoint reuse the export.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from polyrl.evals.suite import EvalError

RUN_PREFIX = "run:"
CHECKPOINT_DIR_TAG = "polyrl.checkpoint_dir"
EXPORT_INFO = "polyrl_checkpoint.json"


@dataclass
class ResolvedModel:
    ref: str  # as the user wrote it
    path: Path  # the model folder the engine loads
    slug: str  # folder-safe name for reports
    run_id: str | None = None
    step: int | None = None


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", text).strip("-.") or "model"


def parse_run_ref(ref: str) -> tuple[str, int | None]:
    """``run:<id>[@<step>]`` → ``(id, step or None)``."""
    body = ref[len(RUN_PREFIX) :]
    run_id, _, step_text = body.partition("@")
    if not run_id:
        raise EvalError(f"--model {ref!r}: expected run:<run_id> or run:<run_id>@<step>")
    if step_text and not step_text.isdigit():
        raise EvalError(f"--model {ref!r}: the step after '@' must be an integer, got {step_text!r}")
    return run_id, int(step_text) if step_text else None


def default_export_dir() -> Path:
    from polyrl.modalities.warmup import default_cache_dir

    return default_cache_dir() / "eval-exports"


def resolve_model(ref: str, *, tracking_uri: str | None = None, cache_dir: str | Path | None = None) -> ResolvedModel:
    if ref.startswith(RUN_PREFIX):
        return _resolve_run(ref, tracking_uri=tracking_uri, cache_dir=Path(cache_dir) if cache_dir else default_export_dir())
    return _resolve_path(ref)


def _resolve_path(ref: str) -> ResolvedModel:
    path = Path(ref).expanduser()
    if not path.exists():
        raise EvalError(f"--model {ref!r}: no such model folder ({path.resolve()}); use a model path or run:<run_id>[@<step>]")
    if not (path / "config.json").is_file():
        raise EvalError(f"--model {ref!r}: {path.resolve()} is not a Hugging Face model folder (no config.json)")
    path = path.resolve()
    return ResolvedModel(ref=ref, path=path, slug=slugify(path.name))


def _resolve_run(ref: str, *, tracking_uri: str | None, cache_dir: Path) -> ResolvedModel:
    from mlflow.exceptions import MlflowException

    from polyrl.platform.checkpoint import checkpoint_dirs, export_model_dir
    from polyrl.platform.tracking import make_client, resolve_tracking_uri

    run_id, step = parse_run_ref(ref)
    uri = resolve_tracking_uri(tracking_uri)
    try:
        run = make_client(uri).get_run(run_id)
    except MlflowException as error:
        raise EvalError(f"--model {ref!r}: no MLflow run {run_id!r} in {uri} ({error.message.splitlines()[0]})") from None
    folder = run.data.tags.get(CHECKPOINT_DIR_TAG)
    if not folder:
        raise EvalError(f"--model {ref!r}: run {run_id} has no {CHECKPOINT_DIR_TAG} tag (is it a polyrl training arm run?)")
    found = checkpoint_dirs(folder)
    if not found:
        raise EvalError(f"--model {ref!r}: run {run_id} has no complete checkpoint in {folder}")
    steps = {int(p.name.split("_")[1]): p for p in found}
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise EvalError(f"--model {ref!r}: run {run_id} has no checkpoint at step {step}; available steps: {sorted(steps)}")
    target = cache_dir / slugify(run_id) / f"step_{step:06d}"
    if not (target / EXPORT_INFO).is_file():  # export_model_dir writes atomically; the marker is last-in
        try:
            export_model_dir(steps[step], target)
        except (FileNotFoundError, KeyError) as error:
            raise EvalError(f"--model {ref!r}: could not export checkpoint {steps[step]}: {error}") from error
    return ResolvedModel(ref=ref, path=target.resolve(), slug=slugify(f"run-{run_id[:12]}-step{step}"), run_id=run_id, step=step)
