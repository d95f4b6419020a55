"""The tool sandbox's worker process: a warm Python that forks one limited child per tool call.

Started by :mod:`polyrl.envs.sandbox` as ``python -I sandbox_worker.py`` (a fresh interpreter
with a minimal environment, never a fork of the trainer), it reads requests on stdin and answers
on stdout, one length-prefixed JSON frame each (JSON, not pickle: nothing a tool's child sends
can run code here or in the trainer). Imports stay in this process, so a call costs a ``fork``
of a small single-threaded Python, not a start-up.

Each call runs in a child forked for it, which before running the tool:

- starts its own session (so every process it might leave behind is killed with its group);
- closes the request and answer pipes, points fds 0, 1, 2 at ``/dev/null``, and catches
  ``sys.stdout`` / ``sys.stderr`` in a sink that ends the call past ``output_chars``;
- sets ``RLIMIT_CORE`` 0, ``RLIMIT_AS`` (this worker's address space + ``memory_mb``),
  ``RLIMIT_CPU`` (``cpu_seconds``: SIGXCPU, then SIGKILL one second later);
- installs a seccomp filter (:mod:`polyrl.envs.sandbox_seccomp`; for root too): no new process
  (threads still work), no exec, no lifting of its limits, no signal, ``ptrace`` or memory access
  to another process (x86-64 and aarch64; elsewhere ``RLIMIT_NPROC`` 1, which binds only a
  non-root user and also refuses threads); Python's own fork/exec entry points raise a clear
  ``PermissionError`` first.

This process enforces the wall limit (kills the child's group), reads at most the bytes an
honest answer can take, and turns a child that died (a signal, ``os._exit``) into an error.
Standard library only until a request names a tool module.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FRAME = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


# --- framing -------------------------------------------------------------------------------------


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message, ensure_ascii=False).encode()
    data = FRAME.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- no new processes ----------------------------------------------------------------------------


def _refuse_processes(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("a tool may not start processes (the tool sandbox refuses fork and exec)")


def load_seccomp() -> Any:
    """:mod:`polyrl.envs.sandbox_seccomp`, loaded by path: this worker imports no package of its own."""
    spec = importlib.util.spec_from_file_location("polyrl_sandbox_seccomp", Path(__file__).with_name("sandbox_seccomp.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SECCOMP = load_seccomp()


def block_process_creation() -> None:
    """The kernel's rules where seccomp works (:mod:`polyrl.envs.sandbox_seccomp`: no new process,
    no lifting of the limits, no signal or ptrace to another process), else RLIMIT_NPROC; and a
    clear Python error."""
    if not _SECCOMP.install_seccomp(_SECCOMP.seccomp_program(os.getpid())):
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve"):
        if hasattr(os, name):
            setattr(os, name, _refuse_processes)
    subprocess.Popen._execute_child = _refuse_processes  # type: ignore[method-assign]


# --- the child -----------------------------------------------------------------------------------


class OutputLimitExceeded(BaseException):
    """Raised by the capped stdout/stderr; a BaseException so ``except Exception`` does not hide it
    (the call is an error even if the tool catches it: the sink remembers)."""


class CappedSink:
    """``sys.stdout`` / ``sys.stderr`` of a call (both streams together). A tool's printing is not
    its result: past ``limit`` characters a write raises. A tool whose printing is its result
    (``keep``, :func:`polyrl.envs.sandbox.prints_result`): the first ``limit`` characters are kept,
    the rest counted."""

    def __init__(self, limit: int, keep: bool):
        self.limit, self.keep, self.written = limit, keep, 0
        self.kept: list[str] = []
        self.kept_chars = 0

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.written += len(text)
        if self.keep:
            piece = text[: max(0, self.limit - self.kept_chars)]
            self.kept.append(piece)
            self.kept_chars += len(piece)
        elif self.written > self.limit:
            raise OutputLimitExceeded()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    @property
    def over(self) -> bool:
        return self.written > self.limit

    def printed(self) -> str:
        text = "".join(self.kept).rstrip("\n")  # the interpreter's last newline is no news
        if self.over:
            text += f"\n[output truncated: {self.written} characters, {self.limit} shown]"
        return text


def capped(text: str, limit: int) -> str:
    """The same cut as :func:`polyrl.envs.tools._capped` (a thread-mode result)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output truncated: {len(text)} characters, {limit} shown]"


def address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def call_in_child(function: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Limits on, then the call; the answer frame's fields. Runs in the forked child."""
    name, limit = request["name"], int(request["output_chars"])
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # no orphan if this worker dies
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sink = CappedSink(limit, keep=bool(request.get("prints_result")))
    sys.stdout = sys.stderr = sink  # type: ignore[assignment]
    memory = address_space_bytes() + int(request["memory_mb"]) * 2**20
    cpu = int(request["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    block_process_creation()
    value: Any = None
    failure: tuple[str, str] | None = None
    try:
        value = function(**request["arguments"])
    except OutputLimitExceeded:
        pass  # reported below, as when the tool caught it
    except MemoryError:
        failure = f"MemoryError: {name} went over its memory limit ({request['memory_mb']} MB)", "memory_limit"
    except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt of a tool included
        failure = f"{type(error).__name__}: {error}", "exception"
    if sink.over and not sink.keep:
        return _error(f"{name} printed more than {limit} characters (what a tool prints is not its result)", limit,
                      "output_limit")  # fmt: skip
    printed = sink.printed() if sink.keep else ""
    if failure is not None:
        return {"ok": False, "content": _joined(printed, capped(f"Error: {failure[0]}", limit)), "error_kind": failure[1]}
    if sink.keep and value is None:
        return {"ok": True, "content": printed or "(no output)", "error_kind": None}
    try:
        text = value if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return {"ok": True, "content": _joined(printed, capped(text, limit)), "error_kind": None}


def _joined(printed: str, text: str) -> str:
    return printed + "\n" + text if printed and not printed.endswith("\n") else printed + text


def _error(message: str, limit: int, kind: str) -> dict[str, Any]:
    return {"ok": False, "content": capped(f"Error: {message}", limit), "error_kind": kind}


# --- this process --------------------------------------------------------------------------------


class Worker:
    def __init__(self, request_fd: int, answer_fd: int):
        self.request_fd, self.answer_fd = request_fd, answer_fd
        self.functions: dict[tuple[str, str], Any] = {}

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        """Import the tool's module (by name, else from its file) and find the function."""
        module_name, qualname, file = request["module"], request["qualname"], request.get("file")
        try:
            try:
                if module_name == "__main__":
                    raise ModuleNotFoundError(name=module_name)
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if error.name != module_name or not file:
                    raise
                module = _module_from_file("__polyrl_tool_main__" if module_name == "__main__" else module_name, file)
            target: Any = module
            for part in qualname.split("."):
                target = getattr(target, part)
            target = getattr(target, "function", target)  # a @tool-decorated name is bound to its Tool
            if not callable(target):
                raise TypeError(f"{module_name}:{qualname} is not callable")
        except BaseException as error:  # noqa: BLE001 - the import's failure goes back to the trainer
            return {"status": "config_error", "message": f"{type(error).__name__}: {error}"}
        self.functions[(module_name, qualname)] = target
        return {"status": "loaded"}

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        function = self.functions[(request["module"], request["qualname"])]
        read_fd, write_fd = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                os.close(read_fd)
                os.close(self.request_fd)
                os.close(self.answer_fd)
                os.setsid()
                answer = call_in_child(function, request)
                data = json.dumps(answer, ensure_ascii=False).encode()
                while data:
                    data = data[os.write(write_fd, data) :]
            except BaseException:  # noqa: BLE001 - whatever happens, the child must not return here
                code = 70
            os._exit(code)
        os.close(write_fd)
        try:
            return self._outcome(pid, read_fd, request, started)
        finally:
            os.close(read_fd)

    def _outcome(self, pid: int, read_fd: int, request: dict[str, Any], started: float) -> dict[str, Any]:
        name, wall, limit = request["name"], float(request["wall_seconds"]), int(request["output_chars"])
        cpu_limit = float(request["cpu_seconds"])
        deadline = started + wall
        # The JSON of what was printed and an error line, `limit` characters each with their notes, at worst.
        most = 12 * limit + 8192
        data, ended = bytearray(), False
        while not ended and len(data) <= most:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(read_fd, 65536)
            ended = not chunk
            data += chunk
        exited = _wait_for_exit(pid, deadline)
        # Not reaped yet, so the pid (and its group id) cannot belong to another process: kill what
        # is left of the group (the child itself at the deadline), then reap.
        _kill_group(pid)
        _, status, usage = os.wait4(pid, 0)
        cpu_used = usage.ru_utime + usage.ru_stime
        if ended and len(data) <= most:
            try:
                answer = json.loads(bytes(data))
                return {"ok": bool(answer["ok"]), "content": str(answer["content"]), "error_kind": answer["error_kind"]}
            except (ValueError, KeyError, TypeError):
                pass
        if not exited and cpu_used < cpu_limit:
            return _error(f"{name} did not finish within {wall:g} s", limit, "timeout")
        if os.WIFSIGNALED(status):
            signal_number = os.WTERMSIG(status)
            if signal_number == signal.SIGXCPU or cpu_used >= cpu_limit:
                return _error(f"{name} used more than {request['cpu_seconds']} s of CPU time", limit, "cpu_limit")
            return _error(f"{name} crashed ({signal.Signals(signal_number).name})", limit, "crash")
        code = os.WEXITSTATUS(status)
        return _error(f"{name} ended its process (exit code {code}) without a result", limit, "crash")

    def serve(self) -> None:
        while True:
            header = read_exactly(self.request_fd, FRAME.size)
            if header is None:
                return  # the trainer closed the pipe (or exited): so does this worker
            request = json.loads(read_exactly(self.request_fd, FRAME.unpack(header)[0]) or b"{}")
            if request["op"] == "load":
                write_frame(self.answer_fd, self.load(request))
            elif request["op"] == "call":
                write_frame(self.answer_fd, self.call(request))


def _wait_for_exit(pid: int, deadline: float) -> bool:
    """Whether the child exited by the deadline; it is left unreaped (``WNOWAIT``)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.002))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _module_from_file(module_name: str, file: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    request_fd, answer_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a print at import time must not corrupt the answer pipe
    os.close(devnull)
    header = read_exactly(request_fd, FRAME.size)
    if header is None:
        return
    hello = json.loads(read_exactly(request_fd, FRAME.unpack(header)[0]) or b"{}")
    sys.path[:] = list(hello["sys_path"])
    write_frame(answer_fd, {"status": "ready", "pid": os.getpid()})
    Worker(request_fd, answer_fd).serve()
    home = os.environ.get("HOME", "")
    if os.path.basename(home).startswith("polyrl-tool-"):  # the trainer's pipe closed: no one else will
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
