"""SIGTERM is Ctrl-C: a run stops at the end of its current step with a checkpoint.

Schedulers (Slurm, Kubernetes, Ray) stop a job with SIGTERM and a grace period; a person
presses Ctrl-C (SIGINT). Both ask for the same thing, so both get the same answer, as in
PyTorch Lightning's and torchtitan's signal handling: the first signal is a request honoured
at the next step boundary (the arm saves a checkpoint of that step and its MLflow runs are
marked KILLED); a second signal, or one that arrives while nothing is training yet, stops at
once. Either way the command ends with one message saying how to resume, and exits with
128 + the signal number, as a shell reports a process stopped by that signal.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

from polyrl.core.errors import PolyrlError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopNow(KeyboardInterrupt):
    """Raised inside the run to unwind it; ``polyrl run`` turns it into :class:`RunInterrupted`."""

    def __init__(self, signum: int, *, step: int | None = None, checkpoint: str | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint


class RunInterrupted(PolyrlError):
    """The run was stopped by a signal; the message says what was kept and how to resume."""

    resumable = True

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopSignals:
    """Context manager: SIGINT/SIGTERM become a stop request checked between steps.

    ``armed`` is True while an arm's training loop runs (a request can wait for the step's
    end); otherwise a signal raises :class:`StopNow` at once. Outside the main thread (where
    Python cannot install handlers) it does nothing and signals keep their defaults.
    """

    def __init__(self, echo: Callable[[str], None] = print):
        self.echo = echo
        self.requested: int | None = None
        self.unannounced: str | None = None  # a request's message not printed yet
        self.armed = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def arm(self) -> None:
        """Enter an arm's training loop: a request now waits for the step's end. A handler a
        library installed while the arm was built (a rollout engine may) is replaced by ours
        again, so the signal still stops the run at a step boundary."""
        for signum in self._previous:
            if signal.getsignal(signum) != self._handle:
                signal.signal(signum, self._handle)
        self.armed = True

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None or not self.armed:
            self.requested = signum
            raise StopNow(signum)
        self.requested = signum
        self.unannounced = f"{name} received: stopping after the current step with a checkpoint (send it again to stop at once)"
        try:
            self.announce()
        except RuntimeError:
            pass  # the signal came in the middle of a write to that console (reentrant): announce() says it next

    def announce(self) -> None:
        """Print the stop request's message if the handler could not (called at safe points)."""
        if self.unannounced is not None:
            self.echo(self.unannounced)
            self.unannounced = None  # after the write: one that raised is said next time
