"""Per-call overhead of the tool sandbox (polyrl/envs/sandbox.py) against a thread of the trainer.

A trivial tool (``add``, defined here) and the shipped calculator, called many times in each mode,
interleaved in rounds so both see the same machine load; plus the first call (the worker's start
and its import of the tool's module) and a trivial snippet of the python tool. Prints medians and
the 10th/90th percentiles in milliseconds, with the load average. docs/benchmarks.md, "Tools in a
sandbox: the cost of a call".

    .venv/bin/python bench/bench_tool_sandbox.py [--calls 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from polyrl.envs import ToolCall, run_tool_call, tool
from polyrl.envs.builtins.calculator import calculator
from polyrl.envs.builtins.python_tool import python
from polyrl.envs.sandbox import SandboxSettings, shutdown_workers


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


CASES = {
    "add": (add, {"a": 2, "b": 3}),
    "calculator": (calculator, {"expression": "123 * 45"}),
    "python": (python, {"code": "print(2 + 3)"}),
}


def timed_calls(name: str, mode: str, n: int) -> list[float]:
    tool_, arguments = CASES[name]
    settings = SandboxSettings(mode=mode)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        result = run_tool_call(ToolCall(tool_.name, arguments), [tool_], timeout_s=5.0, output_chars=200, sandbox=settings)
        times.append(time.perf_counter() - start)
        assert result.ok, result
    return times


def cpu_seconds() -> float:
    """CPU time of this process and of its reaped descendants (the worker, once stopped, with its
    calls' children)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cpu_per_call(name: str, n: int) -> float:
    """CPU seconds a process-mode call costs, all processes together: a fresh worker's n + 1 calls
    against its 1 call (its start and import cancel out), a load-independent figure."""

    def block(calls: int) -> float:
        shutdown_workers()
        start = cpu_seconds()
        timed_calls(name, "process", 1 + calls)
        shutdown_workers()  # reaps the worker: its CPU time and its children's are counted now
        return cpu_seconds() - start

    return (block(n) - block(0)) / n


def summary(times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    return (
        f"median {statistics.median(ms):7.2f} ms  p10 {ms[len(ms) // 10]:7.2f}  p90 {ms[9 * len(ms) // 10]:7.2f}  (n={len(ms)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per case, mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    shutdown_workers()
    first = {}
    for name in CASES:
        first[name] = timed_calls(name, "process", 1)[0]  # the first call of each module: its import in the worker
    print(f"first calls (worker start + module import): { {k: round(v * 1000, 1) for k, v in first.items()} } ms")
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name in CASES:
            for mode in ("process", "thread"):
                if name == "python" and mode == "thread":
                    continue  # refused: the policy's code never runs in the trainer
                results.setdefault((name, mode), []).extend(timed_calls(name, mode, args.calls))
    for (name, mode), times in results.items():
        print(f"{name:11s} {mode:8s} {summary(times)}")
    for name in CASES:
        print(f"{name:11s} CPU per process-mode call, trainer + worker + child: {cpu_per_call(name, args.calls) * 1000:.2f} ms")
    print(f"load average at end: {os.getloadavg()}")
    shutdown_workers()


if __name__ == "__main__":
    main()
