"""``polyrl export RUN OUT``: a training run's checkpoint as a Hugging Face model folder.

``RUN`` is ``run:<run_id>[@<step>]`` (as ``polyrl eval --model``), a checkpoint folder
(``runs/<name>/<arm>/step_N``) or an arm folder (its latest checkpoint). The folder written to
``OUT`` holds the config and tokenizer of the base model and ``model.safetensors``: the trained
weights of a full fine-tuning run, or the base weights with the adapter folded in for a
``model.lora`` run. transformers, vLLM and ``polyrl eval`` load it as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from polyrl.cli.errors import fail, user_errors

console = Console()


def checkpoint_of(run: str, *, tracking_uri: str | None) -> Path:
    """The checkpoint folder ``run`` names (see the module docstring)."""
    from polyrl.core.run_refs import RUN_PREFIX
    from polyrl.evals.models import find_run_checkpoint
    from polyrl.trainer.checkpoint import COMPLETE_MARKER, latest_checkpoint

    if run.startswith(RUN_PREFIX):
        return find_run_checkpoint(run, tracking_uri=tracking_uri)[2]
    path = Path(run).expanduser()
    if (path / COMPLETE_MARKER).is_file():
        return path
    latest = latest_checkpoint(path) if path.is_dir() else None
    if latest is None:
        fail(
            f"{run!r}: not run:<run_id>[@<step>], a complete checkpoint folder (with {COMPLETE_MARKER}) or an arm folder "
            "holding one"
        )
    return latest


def export_command(
    run: str = typer.Argument(
        ..., help="run:<run_id>[@<step>], a checkpoint folder (step_N) or an arm folder (its latest checkpoint)."
    ),
    out: Path = typer.Argument(..., help="The model folder to write (replaced if it exists)."),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="For run:<id>. Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."
    ),
) -> None:
    """Write a checkpoint as a Hugging Face model folder (LoRA runs: base + adapter merged)."""
    from polyrl.trainer.checkpoint import export_model_dir, read_checkpoint_info

    with user_errors(str):
        checkpoint = checkpoint_of(run, tracking_uri=tracking_uri)
        try:
            folder = export_model_dir(checkpoint, out)
        except (FileNotFoundError, KeyError) as error:
            fail(f"could not export {checkpoint}: {error}")
        kind = "base + LoRA adapter, merged" if (checkpoint / "policy_adapter").is_dir() else "full weights"
        console.print(f"[green]exported[/] {checkpoint} (step {read_checkpoint_info(checkpoint)['step']}, {kind}) → {folder}")
