"""Logging to one MLflow run by id, with a disk buffer that waits out a server outage.

While a server is unreachable mid-run every logging call is appended to a file beside the arm's
checkpoints and replayed, in order and without duplicate steps, once it answers again
(:class:`RunLogger`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import numbers
import os
import time
from pathlib import Path
from typing import Any, Callable

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from polyrl.tracking.connection import TrackingUnavailableError, unreachable_reason

# Written last in each step's batch: a step is in MLflow iff this marker is.
STEP_MARKER = "train/step"
MLFLOW_PARAM_VALUE_LIMIT = 6000
ERROR_TAG = "polyrl.error"
# While the server is unreachable, how often a logging call tries it again (a probe costs at
# most PROBE_TIMEOUT_S; in between, calls go straight to the disk buffer).
RETRY_ENV = "POLYRL_MLFLOW_RETRY_S"
DEFAULT_RETRY_S = 30.0
BUFFER_PREFIX = "mlflow_buffer."


def is_metric_value(value: Any) -> bool:
    """A real number, NaN and ±inf included: a NaN loss must show in the curve, not leave a gap
    that reads as "not measured". Only non-numbers (None, strings, bools, tensors) are dropped."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class DiskBuffer:
    """Logging calls kept on disk, one JSON line each, while the tracking server is away."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.count = len(self.entries())

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a process killed mid-append
                continue
        return out

    def append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry, default=_json_default) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.count += 1

    def replace(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
        else:
            staging = self.path.with_name(self.path.name + ".partial")
            staging.write_text("".join(json.dumps(e, default=_json_default) + "\n" for e in entries))
            os.replace(staging, self.path)
        self.count = len(entries)


def _json_default(value: Any) -> Any:
    return float(value) if isinstance(value, numbers.Real) else str(value)


class RunLogger:
    """Logs one run's metrics, params, tags and artifacts to a fixed MLflow run id.

    With ``buffer_dir`` set, a call that fails because the tracking server is unreachable is
    appended to ``<buffer_dir>/mlflow_buffer.<run_id>.jsonl`` (and so is every later call
    until the server answers); the buffer is replayed in order on the first call after the
    server is back, by :meth:`flush`, and by a resumed process. Failures of a server that
    answers (a rejected value) and of local stores are raised as before.
    """

    def __init__(
        self,
        client: MlflowClient,
        run_id: str,
        *,
        buffer_dir: str | Path | None = None,
        echo: Callable[[str], None] | None = None,
    ):
        self.client = client
        self.run_id = run_id
        self.tracking_uri = str(getattr(client, "tracking_uri", ""))
        self.buffer = DiskBuffer(Path(buffer_dir) / f"{BUFFER_PREFIX}{run_id}.jsonl") if buffer_dir else None
        self.echo = echo or print
        self._already_logged_steps: set[int] | None = None
        self._retry_at = 0.0

    # --- the calls ------------------------------------------------------------------------------

    def log_params(self, params: dict[str, Any]) -> None:
        existing = self.client.get_run(self.run_id).data.params
        batch = []
        for key, value in params.items():
            text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
            text = text[:MLFLOW_PARAM_VALUE_LIMIT]
            if key in existing:
                continue  # params are immutable in MLflow; a resumed run already has them
            batch.append(Param(key, text))
        for start in range(0, len(batch), 100):
            self.client.log_batch(self.run_id, params=batch[start : start + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._send({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def logged_steps(self) -> set[int]:
        """Steps MLflow has, plus those waiting in the disk buffer (they will reach it)."""
        try:
            return self._server_steps()
        except Exception as error:
            if self.buffer is None or not self._is_outage(error):
                raise
            return {int(e["step"]) for e in self.buffer.entries() if e["kind"] == "step"}

    def _server_steps(self) -> set[int]:
        if self._already_logged_steps is None:
            history = self.client.get_metric_history(self.run_id, STEP_MARKER)
            self._already_logged_steps = {int(m.step) for m in history}
        return self._already_logged_steps

    def log_step(self, step: int, metrics: dict[str, float]) -> bool:
        """Log one step's metrics atomically; skip a step a killed process already logged.

        Returns False when skipped. A resumed run recomputes the steps after its last
        checkpoint; those that reached MLflow before the kill are not written twice.
        """
        if self._already_logged_steps is not None and step in self._already_logged_steps:
            return False
        values = {key: float(value) for key, value in metrics.items() if is_metric_value(value) and key != STEP_MARKER}
        return self._send({"kind": "step", "step": step, "metrics": values, "timestamp": int(time.time() * 1000)}) is not False

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics that are not part of a training step's atomic batch (e.g. periodic eval)."""
        values = {key: float(value) for key, value in metrics.items() if is_metric_value(value)}
        if values:
            self._send({"kind": "metrics", "step": step, "metrics": values, "timestamp": int(time.time() * 1000)})

    def log_text(self, text: str, artifact_file: str) -> None:
        self._send({"kind": "text", "text": text, "file": artifact_file})

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        self._send({"kind": "table", "rows": rows, "file": artifact_file})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._send({"kind": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def finish(self, status: str = "FINISHED") -> None:
        """Upload what is buffered, then close the run; raises TrackingUnavailableError if the
        server is still away (the buffer stays on disk for a resumed process)."""
        if self.buffer is not None and self.buffer.count and not self.flush():
            raise self._unavailable(f"could not close run {self.run_id} as {status}")
        try:
            terminate_run(self.client, self.run_id, status)
        except Exception as error:
            if self.buffer is None or not self._is_outage(error):
                raise
            raise self._unavailable(f"could not close run {self.run_id} as {status}") from None

    def finish_after_error(self, status: str, message: str | None = None) -> None:
        """Close the run after a failure without hiding it: an unreachable server only gets a line."""
        try:
            if message:
                self.set_tags({ERROR_TAG: message[:5000]})
            self.finish(status)
        except TrackingUnavailableError as error:
            self.echo(f"warning: {error}")

    # --- delivery and the buffer -----------------------------------------------------------------

    def _send(self, entry: dict[str, Any]) -> bool | None:
        if self.buffer is not None and self.buffer.count:
            if time.monotonic() < self._retry_at or not self.flush():
                self.buffer.append(entry)
                return None
        try:
            return self._deliver(entry)
        except Exception as error:
            if self.buffer is None or not self._is_outage(error):
                raise
            self._retry_at = time.monotonic() + _retry_seconds()
            self.echo(
                f"warning: MLflow at {self.tracking_uri} is unreachable ({_short(error)}); training goes on and "
                f"its logs are kept in {self.buffer.path} until the server answers again"
            )
            self._buffer(entry)
            return None

    def _buffer(self, entry: dict[str, Any]) -> None:
        self.buffer.append(entry)
        if entry["kind"] == "step" and self._already_logged_steps is not None:
            self._already_logged_steps.add(int(entry["step"]))  # flush() re-reads the server's set first

    def _deliver(self, entry: dict[str, Any]) -> bool | None:
        kind = entry["kind"]
        if kind == "step":
            step = int(entry["step"])
            if step in self._server_steps():
                return False
            timestamp = int(entry["timestamp"])
            metrics = [Metric(k, v, timestamp, step) for k, v in entry["metrics"].items()]
            metrics.append(Metric(STEP_MARKER, float(step), timestamp, step))
            # MLflow caps a batch at 1000 metrics; the marker goes in the last chunk.
            for start in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
            self._server_steps().add(step)
            return True
        if kind == "metrics":
            step, timestamp = int(entry["step"]), int(entry["timestamp"])
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, timestamp, step) for k, v in entry["metrics"].items()])
        elif kind == "tags":
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in entry["tags"].items()])
        elif kind == "text":
            self.client.log_text(self.run_id, entry["text"], entry["file"])
        elif kind == "table":
            import pandas as pd

            self.client.log_table(self.run_id, data=pd.DataFrame(entry["rows"]), artifact_file=entry["file"])
        elif kind == "artifact":
            self.client.log_artifact(self.run_id, entry["path"], entry["artifact_path"])
        else:
            raise ValueError(f"unknown buffered MLflow call {kind!r}")
        return None

    def flush(self) -> bool:
        """Replay the buffer in order; True when it is empty afterwards."""
        if self.buffer is None or not self.buffer.count:
            return True
        if unreachable_reason(self.tracking_uri) is not None:
            self._retry_at = time.monotonic() + _retry_seconds()
            return False
        entries = self.buffer.entries()
        # The server's own record decides which buffered steps are new: a step sent just before
        # the server fell may have reached it.
        self._already_logged_steps = None
        for index, entry in enumerate(entries):
            try:
                self._deliver(entry)
            except Exception as error:
                if not self._is_outage(error):
                    raise
                rest = entries[index:]
                self.buffer.replace(rest)
                if self._already_logged_steps is not None:
                    self._already_logged_steps |= {int(e["step"]) for e in rest if e["kind"] == "step"}
                self._retry_at = time.monotonic() + _retry_seconds()
                return False
        self.buffer.replace([])
        self._retry_at = 0.0
        steps = [int(e["step"]) for e in entries if e["kind"] == "step"]
        span = f" (steps {min(steps)}-{max(steps)})" if steps else ""
        self.echo(f"MLflow at {self.tracking_uri} answers again: uploaded {len(entries)} buffered logging calls{span}")
        return True

    def _is_outage(self, error: BaseException) -> bool:
        import requests

        if not isinstance(error, (MlflowException, requests.RequestException, OSError)):
            return False
        return unreachable_reason(self.tracking_uri) is not None

    def _unavailable(self, what: str) -> TrackingUnavailableError:
        kept = (
            f"; {self.buffer.count} logging calls are kept in {self.buffer.path}"
            if self.buffer is not None and self.buffer.count
            else ""
        )
        return TrackingUnavailableError(
            f"MLflow at {self.tracking_uri} is unreachable: {what}{kept}. The checkpoints are "
            "saved; once the server answers, resuming uploads the kept calls and closes the run"
        )


class _LogLines(io.TextIOBase):
    """A text stream whose lines go to a logger (so to the run's log file, not the console)."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.strip():
                self.logger.info(line)
        return len(text)


def terminate_run(client: MlflowClient, run_id: str, status: str) -> None:
    """``client.set_terminated``, with what MLflow prints on stdout as a server's run ends ("View run
    … at: …", "View experiment at: …") sent to the log like the rest of the libraries' output:
    polyrl's console is stdout, and it prints its own links."""
    with contextlib.redirect_stdout(_LogLines(logging.getLogger("mlflow.tracking"))):
        client.set_terminated(run_id, status=status)


def _retry_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(RETRY_ENV, DEFAULT_RETRY_S)))
    except ValueError:
        return DEFAULT_RETRY_S


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
