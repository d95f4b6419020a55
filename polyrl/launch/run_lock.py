"""One ``polyrl run`` per experiment folder at a time.

The lock is ``<experiment folder>/.polyrl-run.lock``: an exclusive ``flock`` held for the
whole run, plus the owner's pid, host and start time written inside for the message a second
run prints. The kernel drops a ``flock`` when its process dies (SIGKILL included), so a
crashed run never blocks the next one; the file is left in place (emptied) on release, because
deleting a lock file another process has already opened would let two runs lock two different
files. A non-empty file whose lock is free is a crashed owner's: on this host the pid is
checked to be gone and the lock is taken over; from another host (a shared filesystem whose
``flock`` may not reach across machines) it is refused with the owner named, since its
liveness cannot be checked from here.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from polyrl.core.errors import PolyrlError

LOCK_FILE = ".polyrl-run.lock"


class ExperimentLockedError(PolyrlError):
    """Another process is running this experiment in the same folder."""


@dataclass
class ExperimentLock:
    path: Path
    fd: int
    took_over: dict[str, Any] | None = None

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot; Linux), to tell a reused pid from its owner."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    current = process_start_ticks(pid)
    return start_ticks is None or current is None or current == start_ticks


def _read_owner(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536).decode(errors="replace").strip()
    if not raw:
        return None
    try:
        owner = json.loads(raw)
    except json.JSONDecodeError:
        return {"unreadable": raw[:200]}
    return owner if isinstance(owner, dict) else {"unreadable": raw[:200]}


def describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner or "pid" not in owner:
        return "another process"
    started = f", started {owner['started']}" if owner.get("started") else ""
    command = f": {owner['command']}" if owner.get("command") else ""
    return f"pid {owner['pid']} on host {owner.get('host', '?')}{started}{command}"


def acquire_lock(
    folder: str | Path, *, experiment: str, command: str = "", echo: Callable[[str], None] | None = None
) -> ExperimentLock:
    """Lock ``folder`` for this process or raise :class:`ExperimentLockedError` naming the owner."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExperimentLockedError(
                f"experiment {experiment!r} is already running in {folder} ({describe_owner(_read_owner(fd))}). "
                "Wait for it to finish or stop it; two runs in one folder would overwrite each other's checkpoints. "
                "To run a second copy, give it another name or checkpoint.dir"
            ) from None
        previous = _read_owner(fd)
        if previous is not None:
            _check_takeover(previous, path, experiment)
            if echo is not None:
                echo(f"taking over the lock of a run that is gone ({describe_owner(previous)})")
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "pid_start": process_start_ticks(os.getpid()),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command,
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)  # closing drops the flock too
        raise
    return ExperimentLock(path, fd, took_over=previous)


def _check_takeover(previous: dict[str, Any], path: Path, experiment: str) -> None:
    """The flock was free but an owner is recorded: take over only an owner known to be gone."""
    if "pid" not in previous:
        return  # torn or foreign content, and nobody holds the lock
    same_host = previous.get("host") == socket.gethostname()
    if same_host and not pid_alive(int(previous["pid"]), previous.get("pid_start")):
        return
    where = "is still running" if same_host else "may still be running on another machine"
    raise ExperimentLockedError(
        f"experiment {experiment!r}: {path} names {describe_owner(previous)}, which {where} "
        f"(its lock could not be checked from here). If that run is gone, delete {path} and run again"
    )
