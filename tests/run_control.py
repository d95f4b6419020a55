"""The real ``polyrl run`` CLI in a child process that acts at exact training steps: the
reliability tests (tests/launch, tests/tracking) kill, pause or hold a run through it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# argv: ACTION, the steps (comma-separated), then the `polyrl run` arguments.
# After a held or paused step the child touches 'at_step_<step>' and waits for 'go' or 'go_<step>'.
CHILD = """
import os, signal, sys, time
from pathlib import Path
from polyrl.trainer import checkpoint
from polyrl.trainer import hooks
from polyrl.trainer import loop
from polyrl.cli.main import app

ACTION, AT = sys.argv[1], {int(s) for s in sys.argv[2].split(",")}
if ACTION == "kill_after_save":  # SIGKILL right after the step's checkpoint is complete
    original_save = hooks.Checkpointer.save
    def save(self, step, extra=None):
        path = original_save(self, step, extra)
        if step in AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return path
    hooks.Checkpointer.save = save
elif ACTION == "kill_before_rename":  # SIGKILL after the step's files and marker, before the rename
    original_write = checkpoint._write_checkpoint_files
    def write(staging, *, step, **kwargs):
        original_write(staging, step=step, **kwargs)
        if step in AT:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint._write_checkpoint_files = write
elif ACTION in ("pause_after_step", "hold_after_step"):  # tell the test, then pause 3 s (or wait for go)
    original_step = loop.TrainingLoop.step
    def step(self):
        metrics = original_step(self)
        if self.step_index in AT:
            Path(f"at_step_{self.step_index}").touch()
            deadline = time.time() + (3 if ACTION == "pause_after_step" else 300)
            while time.time() < deadline and not (Path("go").exists() or Path(f"go_{self.step_index}").exists()):
                time.sleep(0.05)
        return metrics
    loop.TrainingLoop.step = step
else:
    raise SystemExit(f"unknown action {ACTION!r}")
sys.argv = ["polyrl", "run", *sys.argv[3:]]
app()
"""


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick, then released): for a server a test
    starts, or for an address that must be refused."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """This environment, unbuffered and wide, without a tracking URI or Ray address of its own."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


def _command(action: str, at: int | str, args: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-c", CHILD, action, str(at), *args]


def run_child(folder: Path, env: dict[str, str], action: str, at: int | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(action, at, args), cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def start_child(folder: Path, env: dict[str, str], action: str, at: int | str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        _command(action, at, args), cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``path`` exists; fails if the child exits first or the time runs out."""
    deadline = time.time() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def polyrl_here(folder: Path, monkeypatch, *args: str):
    """``polyrl ARGS`` in this process (Typer's runner: exit code, stdout and stderr apart), from
    ``folder``, in :func:`child_env`'s terms (wide, no tracking URI or Ray address of its own);
    an exception that escaped the command fails here (a traceback a user would have seen). For
    tests of what a command does rather than of its process: an interpreter start-up costs
    10-15 CPU-seconds."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from polyrl.cli.main import app

    with monkeypatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("COLUMNS", "200")
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("RAY_ADDRESS", raising=False)
        result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)
