"""Tool calls in worker processes, under CPU, memory, wall-time and output limits.

``env.tool_sandbox.mode: process`` (the default) runs every tool call of
:func:`polyrl.envs.tools.run_tool_call` in :mod:`polyrl.envs.sandbox_worker`: a warm Python
started once (``python -I``, a minimal environment: ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR``
a fresh temporary folder that is also its working directory; nothing else of the trainer's, so no
``HF_TOKEN``, ``MLFLOW_*`` or ``AWS_*``), which forks one limited child per call. A call that
loops, allocates without bound, forks, crashes, calls ``os._exit`` or prints megabytes comes back
as an ``Error: ...`` result; the worker goes on, and a worker that stops answering is killed and
replaced. ``mode: thread`` is the old way: a daemon thread of the trainer, under the wall limit
only (a timed-out call runs on; Python cannot stop a thread).

A tool crosses into the worker by reference: its function must be importable as
``module:qualified.name`` (defined at a module's top level; a ``@tool``-decorated name is found
through its :class:`~polyrl.envs.tools.Tool`), or live in a file the worker can load by path (an
environment loaded as ``file.py:Class``). Lambdas, closures, bound methods and
``functools.partial`` are refused with :class:`~polyrl.envs.base.EnvConfigError`. Arguments and
results cross as JSON.

It is not a container: the child reads and writes the files and reaches the network the OS user
can (docs/episodes.md, "Tools in a sandbox").
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from polyrl.envs.errors import EnvConfigError
from polyrl.envs.sandbox_worker import FRAME, read_exactly, write_frame

__all__ = [
    "SandboxOutcome",
    "SandboxSettings",
    "check_tools_for_sandbox",
    "is_sandbox_only",
    "prints_result",
    "run_in_sandbox",
    "sandbox_only",
    "shutdown_workers",
    "tool_reference",
]

WORKER_SCRIPT = Path(__file__).with_name("sandbox_worker.py")
START_TIMEOUT_S = 30.0  # a fresh interpreter's start, on a loaded machine
LOAD_TIMEOUT_S = 120.0  # importing a tool's module (it may import numpy, sympy, ...)
ANSWER_GRACE_S = 5.0  # past the wall limit: the worker kills the call's child and answers
MAX_FRAME_BYTES = 64 * 2**20
# Thread counts of numerical libraries: one, so a call's CPU time is its own and a fork is safe.
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class SandboxSettings:
    """How tool calls run (``env.tool_sandbox``): ``process`` (limits below) or ``thread``.
    ``cpu_seconds`` None: the wall limit (``env.tool_timeout_s``) rounded up to whole seconds
    (``RLIMIT_CPU`` counts seconds). ``memory_mb``: the address space a call may add to the
    worker's own (``RLIMIT_AS``)."""

    mode: Literal["process", "thread"] = "process"
    cpu_seconds: int | None = None
    memory_mb: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in ("process", "thread"):
            raise EnvConfigError(f"tool_sandbox.mode must be 'process' or 'thread', got {self.mode!r}")
        if self.cpu_seconds is not None and (not isinstance(self.cpu_seconds, int) or self.cpu_seconds < 1):
            raise EnvConfigError(f"tool_sandbox.cpu_seconds must be a whole number of seconds >= 1, got {self.cpu_seconds!r}")
        if not isinstance(self.memory_mb, int) or self.memory_mb < 16:
            raise EnvConfigError(f"tool_sandbox.memory_mb must be an integer >= 16, got {self.memory_mb!r}")

    def cpu_limit(self, timeout_s: float) -> int:
        return self.cpu_seconds if self.cpu_seconds is not None else max(1, math.ceil(timeout_s))


@dataclass(frozen=True)
class SandboxOutcome:
    ok: bool
    content: str
    error_kind: str | None


def sandbox_only(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a tool function that must never run in the trainer process (it runs code the policy
    wrote): ``mode: thread`` refuses it."""
    function.polyrl_sandbox_only = True  # type: ignore[attr-defined]
    return function


def prints_result(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a sandbox-only tool whose printed output is its result (a code interpreter): what it
    prints, cut to ``env.tool_output_chars`` with a note of its full length, then its return value
    if not None; an exception adds ``Error: <type>: <message>`` after what was printed. Other
    tools' printing is not their result, and past ``env.tool_output_chars`` makes the call an error."""
    function.polyrl_prints_result = True  # type: ignore[attr-defined]
    return sandbox_only(function)


def is_sandbox_only(function: Callable[..., Any]) -> bool:
    return bool(getattr(function, "polyrl_sandbox_only", False))


@dataclass(frozen=True)
class ToolReference:
    module: str
    qualname: str
    file: str | None

    def key(self) -> tuple[str, str]:
        return self.module, self.qualname


def tool_reference(name: str, function: Callable[..., Any]) -> ToolReference:
    """Where the worker finds ``function``, or :class:`EnvConfigError` saying why it cannot."""
    module_name, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    target: Any = module
    for part in qualname.split(".") if isinstance(qualname, str) and module is not None else [None]:
        target = getattr(target, part, None) if part is not None else None
    if target is not function and getattr(target, "function", None) is not function:
        raise EnvConfigError(
            f"tool {name!r}: its function {function!r:.120} is not importable by reference (module:function), which "
            "env.tool_sandbox.mode: process needs to run it in a worker process; define it at the top level of a "
            "module (no lambda, closure, bound method or functools.partial), or set env.tool_sandbox.mode: thread"
        )
    return ToolReference(module_name, qualname, getattr(module, "__file__", None))  # type: ignore[arg-type]


def check_tools_for_sandbox(tools: Any, settings: SandboxSettings) -> None:
    """What can be checked before a call (an environment's class-level ``tools``): in process mode
    each function is importable by reference; in thread mode none is sandbox-only."""
    if not isinstance(tools, (list, tuple)):
        return
    for tool in tools:
        name, function = getattr(tool, "name", None), getattr(tool, "function", None)
        if not callable(function):
            continue
        if settings.mode == "process":
            tool_reference(str(name), function)
        elif is_sandbox_only(function):
            raise EnvConfigError(thread_refusal(str(name)))


def thread_refusal(name: str) -> str:
    return (
        f"tool {name!r} runs code the policy wrote and must not run in the trainer process; "
        "env.tool_sandbox.mode: thread is refused for it (allowed: process)"
    )


def worker_environment(home: str) -> dict[str, str]:
    """The worker's whole environment: nothing inherited but the locale."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": os.environ.get("LANG", "C.UTF-8"), "HOME": home, "TMPDIR": home}
    env.update(dict.fromkeys(_ONE_THREAD, "1"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class WorkerLost(Exception):
    """The worker did not answer in time (``kind`` timeout) or its pipe closed (crash)."""

    def __init__(self, message: str, kind: str = "crash"):
        super().__init__(message)
        self.kind = kind


class _Worker:
    def __init__(self) -> None:
        self.owner = os.getpid()
        self.home = tempfile.mkdtemp(prefix="polyrl-tool-")
        self.loaded: set[tuple[str, str]] = set()
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=worker_environment(self.home), cwd=self.home, close_fds=True, bufsize=0, start_new_session=True,
        )  # fmt: skip
        paths = [os.path.abspath(p or os.curdir) for p in sys.path]
        answer = self.request({"op": "hello", "sys_path": paths}, START_TIMEOUT_S)
        if answer.get("status") != "ready":
            raise WorkerLost(f"the tool worker did not start: {answer!r:.200}")

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            write_frame(self.process.stdin.fileno(), message)
        except OSError as error:
            raise WorkerLost(f"the tool worker's pipe closed ({error})") from None
        fd, deadline = self.process.stdout.fileno(), time.monotonic() + timeout_s
        if not _readable(fd, timeout_s):
            raise WorkerLost(f"the tool worker did not answer within {timeout_s:g} s", "timeout")
        header = _read_by(fd, FRAME.size, deadline)
        size = FRAME.unpack(header)[0]
        if size > MAX_FRAME_BYTES:
            raise WorkerLost(f"the tool worker sent a {size}-byte answer")
        return json.loads(_read_by(fd, size, deadline))

    def close(self) -> None:
        if self.owner != os.getpid():  # a forked trainer process must not touch its parent's worker
            return
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.home, ignore_errors=True)


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` has data (or EOF) within ``timeout_s``; poll, not select: a trainer holding
    a thousand files (vLLM, Ray) has descriptors past select's limit of 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def _read_by(fd: int, n: int, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if not _readable(fd, left):
        raise WorkerLost("the tool worker did not answer in time", "timeout")
    data = read_exactly(fd, n)  # the worker writes a frame at once: no wait past its first bytes
    if data is None:
        raise WorkerLost("the tool worker exited")
    return data


class _WorkerPool:
    """Warm workers, one per call running at the same time; a lost one is dropped for a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []

    def take(self) -> _Worker:
        with self.lock:
            while self.idle:
                worker = self.idle.pop()
                if worker.owner == os.getpid() and worker.process.poll() is None:
                    return worker
                worker.close()
        return _Worker()

    def give_back(self, worker: _Worker) -> None:
        with self.lock:
            self.idle.append(worker)

    def close(self) -> None:
        with self.lock:
            workers, self.idle = self.idle, []
        for worker in workers:
            worker.close()


_POOL = _WorkerPool()
atexit.register(_POOL.close)


def shutdown_workers() -> None:
    """Stop the warm workers (the next call starts a fresh one)."""
    _POOL.close()


def run_in_sandbox(name: str, function: Callable[..., Any], arguments: dict[str, Any], *, timeout_s: float,
                   output_chars: int, settings: SandboxSettings) -> SandboxOutcome:  # fmt: skip
    """One call in a worker's child; an import failure of the tool's module raises
    :class:`EnvConfigError`, every failure of the call itself is an ``Error: ...`` outcome."""
    reference = tool_reference(name, function)
    try:
        json.dumps(arguments)
    except (TypeError, ValueError) as error:
        return SandboxOutcome(False, f"Error: bad arguments for {name}: not JSON ({error})", "bad_arguments")
    worker = _POOL.take()
    try:
        if reference.key() not in worker.loaded:
            loaded = worker.request({"op": "load", "module": reference.module, "qualname": reference.qualname,
                                     "file": reference.file}, LOAD_TIMEOUT_S)  # fmt: skip
            if loaded.get("status") != "loaded":
                raise EnvConfigError(
                    f"tool {name!r}: the sandbox worker could not load {reference.module}:{reference.qualname}"
                    f"{f' (file {reference.file})' if reference.file else ''}: {loaded.get('message')}"
                )
            worker.loaded.add(reference.key())
        request = {
            "op": "call", "module": reference.module, "qualname": reference.qualname, "name": name,
            "arguments": arguments, "wall_seconds": timeout_s, "cpu_seconds": settings.cpu_limit(timeout_s),
            "memory_mb": settings.memory_mb, "output_chars": output_chars,
            "prints_result": bool(getattr(function, "polyrl_prints_result", False)),
        }  # fmt: skip
        answer = worker.request(request, timeout_s + ANSWER_GRACE_S)
    except WorkerLost as error:
        worker.close()
        return SandboxOutcome(False, f"Error: {name} could not run: {error}; the tool worker was replaced", error.kind)
    except BaseException:
        worker.close()
        raise
    _POOL.give_back(worker)
    return SandboxOutcome(bool(answer["ok"]), str(answer["content"]), answer.get("error_kind"))
