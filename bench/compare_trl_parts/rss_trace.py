"""Resident memory per phase of a running process: a sampler thread plus phase labels.

``RssTrace`` reads ``/proc/self/statm`` every ``interval_s`` from a daemon thread and keeps, per
phase (a label set by :meth:`RssTrace.phase` or :meth:`RssTrace.wrap`), the RSS on entry, on exit
and the highest sample within it. Brief spikes between two samples can be missed; the process's
true high-water mark is ``ru_maxrss`` (printed beside it). Used by ``compare_trl.py --trace-rss``
on both sides (polyrl's collect / update / sync, TRL's generate / micro-batch / optimizer step).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import resource
import threading
import time
from typing import Any, Callable, Iterator

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """This process's resident set now (``/proc/self/statm``'s second field, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def malloc_mib() -> dict[str, float]:
    """glibc's own account (``mallinfo2``, all arenas): bytes handed out and held (``live``: in-use
    chunks plus mmapped blocks) and freed but kept in the arenas (``kept``); {} where not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return {}
    info = libc.mallinfo2()
    return {"live": (info.uordblks + info.hblkhd) / 2**20, "kept": info.fordblks / 2**20}


def peak_rss_mib() -> float:
    """This process's resident-set high-water mark (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RssTrace:
    """Per-phase RSS: entry, exit and peak of each occurrence, in order."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []  # one per phase occurrence: name, start, end, peak (MiB), seconds
        self._open: list[dict[str, Any]] = []  # nested phases: the innermost is last
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = rss_mib()
            with self._lock:
                for row in self._open:
                    row["peak"] = max(row["peak"], now)

    def mark(self, name: str) -> None:
        """A point (no duration): the RSS now under ``name``."""
        now = rss_mib()
        self.rows.append({"phase": name, "start": now, "end": now, "peak": now, "seconds": 0.0, **malloc_mib()})

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        row = {"phase": name, "start": rss_mib(), "peak": 0.0, "began": time.perf_counter()}
        row["peak"] = row["start"]
        with self._lock:
            self._open.append(row)
        try:
            yield
        finally:
            row["end"] = rss_mib()
            row.update(malloc_mib())
            row["seconds"] = time.perf_counter() - row.pop("began")
            with self._lock:
                row["peak"] = max(row["peak"], row["end"])
                self._open.remove(row)
            self.rows.append(row)

    def wrap(self, owner: Any, attribute: str, name: str | None = None) -> None:
        """Replace ``owner.attribute`` (a function or bound method) by one traced as phase ``name``."""
        inner: Callable[..., Any] = getattr(owner, attribute)

        @functools.wraps(inner)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name or attribute):
                return inner(*args, **kwargs)

        setattr(owner, attribute, traced)

    def close(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        return [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()} for row in self.rows]


def format_trace(rows: list[dict[str, Any]], title: str) -> str:
    """A markdown table of ``rows`` (from :meth:`RssTrace.close`)."""
    lines = [
        f"{title}\n",
        "| phase | s | RSS on entry MiB | peak within | on exit | malloc live / kept on exit |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['phase']} | {r['seconds']:.1f} | {r['start']:.0f} | {r['peak']:.0f} | {r['end']:.0f} | "
        f"{r.get('live', float('nan')):.0f} / {r.get('kept', float('nan')):.0f} |"
        for r in rows
    ]
    return "\n".join(lines)
