"""What a command shows on the terminal, and where the libraries' chatter goes.

By default the terminal shows polyrl's own lines (experiment, arms, progress bar, health
warnings, errors); everything the libraries say — vLLM's and transformers' logs, Python
warnings, tqdm bars, and what C/C++ code writes straight to file descriptors 1 and 2 (torch's
kernel-registration and NUMA warnings) — goes to a log file in the run folder
(``<checkpoint.dir>/<name>/polyrl.log``). ``--verbose`` shows the library logs on the terminal
as well (and keeps writing them to the file; native writes then stay on the terminal only).

How (non-verbose): Python logging of the library loggers propagates to one file handler on the
root logger; ``warnings`` are captured into logging; file descriptors 1 and 2 point at the log
file while the command runs, and ``sys.stdout`` is re-opened on the saved terminal descriptor so
the CLI's rich console (which writes to ``sys.stdout``) still reaches the user. ``sys.stderr``
is left on descriptor 2 (the log): libraries print progress bars and notices there. User errors
are printed by ``user_errors`` after this context has closed, so they reach the terminal.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

LOG_FILE = "polyrl.log"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Libraries that attach their own handlers (and set propagate=False) on import; their records
# are sent to the root logger's handlers instead.
LIBRARY_LOGGERS = (
    "vllm",
    "transformers",
    "torch",
    "mlflow",
    "alembic",
    "sqlalchemy.engine",
    "huey",
    "ray",
    "urllib3",
    "accelerate",
    "datasets",
    "huggingface_hub",
    "filelock",
    "py.warnings",
)


def quiet_library_environment() -> None:
    """Environment read by the libraries at import time: before ``vllm``/``transformers`` load.

    vLLM otherwise installs its own stdout handler at import; with it off its loggers propagate
    to ours. A user's explicit setting wins.
    """
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # "Generating train split", "Map" bars
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _route_library_loggers() -> list[tuple[logging.Logger, list[logging.Handler], bool, int]]:
    """Strip the libraries' own handlers so their records reach the root handlers; return what to restore."""
    # transformers and mlflow configure their loggers when first imported: import them now so
    # a later import does not re-attach a terminal handler behind our back.
    for module in ("transformers.utils.logging", "mlflow"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - a library that is not installed has nothing to route
            pass
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate, logger.level))
        logger.handlers = []
        logger.propagate = True
    # transformers' INFO level dumps every config it reads; its warnings are what matter.
    logging.getLogger("transformers").setLevel(logging.WARNING)
    for noisy in ("sqlalchemy.engine", "alembic", "huey", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return saved


class _TerminalHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at emit time (rich's progress display swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


def _on_fd(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False  # e.g. a test runner's in-memory stream: it is not the terminal's descriptor


def _reopen(fd: int, like) -> io.TextIOWrapper:
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(like, "encoding", None) or "utf-8", errors="replace")


@contextmanager
def _native_output_to(log_fd: int) -> Iterator[None]:
    """Point fds 1 and 2 at the log; ``sys.stdout`` and polyrl's error console keep the terminal.

    ``user_errors`` prints on ``sys.stderr`` (now the log) when a command catches its own error
    inside this block, so its console is pointed at the terminal's stderr meanwhile.
    """
    from polyrl.core.console import error_console

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or odd stream: nothing to flush
            pass
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    original_stdout = sys.stdout
    terminal_out = _reopen(saved[1], original_stdout) if _on_fd(original_stdout, 1) else None
    terminal_err = _reopen(saved[2], sys.stderr) if _on_fd(sys.stderr, 2) else sys.stderr
    previous_error_file = error_console._file
    if terminal_out is not None:
        sys.stdout = terminal_out
    error_console.file = terminal_err
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr, terminal_err):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os.dup2(saved[1], 1)
        os.dup2(saved[2], 2)
        for fd in saved.values():
            os.close(fd)
        error_console._file = previous_error_file  # None: "sys.stderr at write time" again
        if terminal_out is not None:
            sys.stdout = original_stdout
            terminal_out.close()
        if terminal_err is not sys.stderr:
            terminal_err.close()


@contextmanager
def command_logging(log_path: str | Path, *, verbose: bool, command: str = "polyrl") -> Iterator[Path]:
    """Send the libraries' output to ``log_path`` (appended; one header line per command) for the block.

    With ``verbose`` the same records also go to the terminal (stderr) and native writes stay there.
    """
    from polyrl.engines.vllm_quiet import install_weight_sync_filter

    quiet_library_environment()
    install_weight_sync_filter()
    log_path = Path(log_path)
    created = [folder for folder in (log_path.parent, *log_path.parent.parents) if not folder.exists()]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not log_path.exists()
    with ExitStack() as stack:
        # A command refused before anything was logged (an unreachable MLflow, a bad name)
        # leaves no log file and no folder behind.
        stack.callback(_remove_if_only_header, log_path, new_file, created)
        log_file = stack.enter_context(open(log_path, "a", buffering=1, encoding="utf-8"))
        log_file.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {command} =====\n")
        root = logging.getLogger()
        handlers: list[logging.Handler] = [logging.StreamHandler(log_file)]
        if verbose:
            handlers.append(logging.StreamHandler(sys.stderr))
        for handler in handlers:
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            root.addHandler(handler)
        old_level = root.level
        root.setLevel(logging.INFO)
        saved = _route_library_loggers()
        logging.captureWarnings(True)
        polyrl_logger = logging.getLogger("polyrl")
        terminal = None if verbose else _TerminalHandler()
        if terminal is not None:
            # polyrl's own warnings (e.g. a weight sync that left a layer stale) are for the user.
            terminal.setLevel(logging.WARNING)
            terminal.setFormatter(logging.Formatter("warning: %(message)s"))
            polyrl_logger.addHandler(terminal)
        try:
            if verbose:
                yield log_path
            else:
                with _native_output_to(log_file.fileno()):
                    yield log_path
        finally:
            logging.captureWarnings(False)
            if terminal is not None:
                polyrl_logger.removeHandler(terminal)
            for logger, old_handlers, propagate, level in saved:
                logger.handlers = old_handlers
                logger.propagate = propagate
                logger.setLevel(level)
            for handler in handlers:
                root.removeHandler(handler)
                handler.flush()
            root.setLevel(old_level)


def _remove_if_only_header(log_path: Path, new_file: bool, created: list[Path]) -> None:
    try:
        if not new_file or len(log_path.read_text(encoding="utf-8").strip().splitlines()) > 1:
            return
        log_path.unlink()
        for folder in created:  # innermost first
            folder.rmdir()
    except OSError:
        pass  # a folder the command filled, or a file already gone: leave it


def experiment_log_path(config_path: str | Path, set_options: list[str] | None = None) -> Path:
    """``<checkpoint.dir>/<name>/polyrl.log`` of an experiment file (the folder ``polyrl run`` writes)."""
    from polyrl.config.schema import load_experiment

    first = next(iter(load_experiment(config_path, set_options=set_options).values()))
    return Path(first.checkpoint.dir) / first.name / LOG_FILE


def eval_log_path(suite: str, out: str | Path | None) -> Path:
    """The eval's report folder when given, else ``reports/eval/<suite>/polyrl.log``."""
    if out is not None:
        return Path(out) / LOG_FILE
    stem = Path(suite).stem if suite.endswith((".yaml", ".yml")) else suite
    return Path("reports") / "eval" / "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) / LOG_FILE
