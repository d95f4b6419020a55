"""What ``--model`` names: a Hugging Face model folder, or a training run's checkpoint.

- ``PATH`` — a local model folder (``config.json`` + weights + tokenizer);
- ``run:<run_id>`` — the latest complete checkpoint of a training arm run;
- ``run:<run_id>@<step>`` — that run's checkpoint at ``step``.

A run's checkpoints are found through its ``polyrl.checkpoint_dir`` tag, but a folder is only
where a run *was*: a later run of the same experiment reuses it (moving the earlier files to
``<experiment>.previous-<time>``). So a checkpoint counts as the run's only when the MLflow run
id stored inside it is that run's; the archived copies are searched too, and a folder holding
another run's weights is refused, naming that run. The chosen checkpoint is exported once
(:func:`polyrl.trainer.checkpoint.export_model_dir`) into ``<cache>/eval-exports/<run>/step_<n>``;
later evals reuse the export while it was made from the same run's checkpoint.

A run's model is asked as it was trained: a suite dataset that sets no chat settings of its own
formats its prompts with the run's ``data.chat_template`` and ``data.system_prompt`` (read from
the checkpoint's resolved config), as periodic evaluation inside that run did. Without this a
run trained on chat-formatted prompts would be scored on raw ones, silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from polyrl.core.run_refs import RUN_PREFIX, split_run_ref
from polyrl.data.chat import ChatFormat
from polyrl.evals.suite import EvalError

CHECKPOINT_DIR_TAG = "polyrl.checkpoint_dir"
EXPORT_INFO = "polyrl_checkpoint.json"


@dataclass
class ResolvedModel:
    ref: str  # as the user wrote it
    path: Path  # the model folder the engine loads
    slug: str  # folder-safe name for reports
    run_id: str | None = None
    step: int | None = None
    chat: ChatFormat | None = None  # a run's own data chat settings (None: a folder, or a run that stored none)


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", text).strip("-.") or "model"


def parse_run_ref(ref: str) -> tuple[str, int | None]:
    """``run:<id>[@<step>]`` → ``(id, step or None)``."""
    try:
        return split_run_ref(ref)
    except ValueError as error:
        raise EvalError(f"--model {ref!r}: {error}") from None


def default_export_dir() -> Path:
    from polyrl.policies.warmup import default_cache_dir

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


def run_checkpoints(run_id: str, folder: str | Path) -> tuple[dict[int, Path], set[str]]:
    """The run's complete checkpoints by step — from its tagged folder first, then the archived
    copies of that folder — and the ids of other runs whose checkpoints were found there.

    A checkpoint that stores no run id (written outside ``polyrl run``) is taken as the run's.
    """
    from polyrl.trainer.checkpoint import checkpoint_dirs, checkpoint_step, read_checkpoint_info

    folder = Path(folder)
    experiment = folder.parent
    archived = sorted(experiment.parent.glob(f"{experiment.name}.previous-*/{folder.name}"), reverse=True)
    owned: dict[int, Path] = {}
    others: set[str] = set()
    for directory in [folder, *archived]:
        for path in checkpoint_dirs(directory):
            owner = read_checkpoint_info(path).get("mlflow_run_id")
            if owner is None or owner == run_id:
                owned.setdefault(checkpoint_step(path), path)
            else:
                others.add(owner)
    return owned, others


def _export_matches(target: Path, checkpoint: Path) -> bool:
    """A cached export is reused only if it was made from this very run's checkpoint."""
    from polyrl.trainer.checkpoint import read_checkpoint_info

    try:
        made_from = json.loads((target / EXPORT_INFO).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return made_from.get("checkpoint") == str(checkpoint.resolve()) and made_from.get("mlflow_run_id") == read_checkpoint_info(
        checkpoint
    ).get("mlflow_run_id")


def _runs_below(client, run) -> str | None:
    """For a run that trained nothing itself (an arm's run over seeds, an experiment's run): the
    runs under it that hold checkpoints, to pick from; ``None`` for any other run."""
    from polyrl.tracking.mlflow_runs import ARM_TAG, ROLE_TAG, SEED_TAG, find_arm_runs, find_seed_runs

    role, run_id = run.data.tags.get(ROLE_TAG), run.info.run_id
    if role == "arm":
        below = [(f"seed {r.data.tags.get(SEED_TAG)}", r) for r in find_seed_runs(client, run.info.experiment_id, run_id)]
        what = f"run {run_id} is arm {run.data.tags.get(ARM_TAG)!r}'s run over its seeds; each seed's run holds its checkpoints"
    elif role == "experiment":
        below = [(f"arm {r.data.tags.get(ARM_TAG)}", r) for r in find_arm_runs(client, run.info.experiment_id, run_id)]
        what = f"run {run_id} is the experiment's run; its arms' runs hold the checkpoints"
    else:
        return None
    if not below:
        return None
    choices = " ".join(f"--model run:{r.info.run_id}" for _, r in below)
    listed = ", ".join(f"{name}: run:{r.info.run_id} ({r.info.status})" for name, r in below)
    return f"{what}. Evaluate one of them, or several at once ({choices}): {listed}"


def find_run_checkpoint(ref: str, *, tracking_uri: str | None) -> tuple[str, int, Path]:
    """``run:<id>[@<step>]`` → ``(run id, step, checkpoint folder)``: the run's own checkpoint at
    that step (default: its latest), refused with an :class:`EvalError` that says why otherwise."""
    from mlflow.exceptions import MlflowException

    from polyrl.tracking.mlflow_runs import make_client, resolve_tracking_uri

    run_id, step = parse_run_ref(ref)
    uri = resolve_tracking_uri(tracking_uri)
    try:
        run = make_client(uri).get_run(run_id)
    except MlflowException as error:
        raise EvalError(f"--model {ref!r}: no MLflow run {run_id!r} in {uri} ({error.message.splitlines()[0]})") from None
    folder = run.data.tags.get(CHECKPOINT_DIR_TAG)
    if not folder:
        raise EvalError(
            f"--model {ref!r}: "
            + (
                _runs_below(make_client(uri), run)
                or f"run {run_id} has no {CHECKPOINT_DIR_TAG} tag (is it a polyrl training arm run?)"
            )
        )
    steps, others = run_checkpoints(run_id, folder)
    if not steps and others:
        raise EvalError(
            f"--model {ref!r}: the checkpoints in {folder} belong to another run ({', '.join(sorted(others))}), not "
            f"{run_id}: a later run of the experiment reused the folder and run {run_id}'s own checkpoints are gone. "
            f"Evaluate run:<that id> for those weights"
        )
    if not steps:
        raise EvalError(f"--model {ref!r}: run {run_id} has no complete checkpoint in {folder}")
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise EvalError(f"--model {ref!r}: run {run_id} has no checkpoint at step {step}; available steps: {sorted(steps)}")
    return run_id, step, steps[step]


def _resolve_run(ref: str, *, tracking_uri: str | None, cache_dir: Path) -> ResolvedModel:
    from polyrl.trainer.checkpoint import export_model_dir

    run_id, step, checkpoint = find_run_checkpoint(ref, tracking_uri=tracking_uri)
    target = cache_dir / slugify(run_id) / f"step_{step:06d}"
    if not _export_matches(target, checkpoint):  # export_model_dir writes atomically; the marker is last-in
        try:
            export_model_dir(checkpoint, target)
        except (FileNotFoundError, KeyError) as error:
            raise EvalError(f"--model {ref!r}: could not export checkpoint {checkpoint}: {error}") from error
    return ResolvedModel(
        ref=ref,
        path=target.resolve(),
        slug=slugify(f"run-{run_id[:12]}-step{step}"),
        run_id=run_id,
        step=step,
        chat=run_chat_format(checkpoint),
    )


def run_chat_format(checkpoint: Path) -> ChatFormat | None:
    """The chat settings the run's training prompts were formatted with (its resolved config's
    ``data``, stored in the checkpoint); None when the checkpoint holds no config."""
    from polyrl.trainer.checkpoint import read_checkpoint_info

    data = (read_checkpoint_info(checkpoint).get("config") or {}).get("data")
    if not isinstance(data, dict):
        return None
    return ChatFormat(
        data.get("chat_template"),
        data.get("system_prompt"),
        data.get("messages_field", "messages"),
        where="the run's data (its checkpoint's config)",
    )
