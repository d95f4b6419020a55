"""The benchmarks are not run in the suite (speed is measured in bench/, not in tests), but each
must stay a valid script: it compiles and its ``--help`` answers."""

from __future__ import annotations

import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = sorted((Path(__file__).resolve().parents[1] / "bench").glob("*.py"))


def test_there_are_benchmarks():
    assert {p.name for p in BENCH} >= {"bench_step.py", "compare_trl.py", "bench_runtime_env.py", "bench_compile.py"}


@pytest.mark.parametrize("script", BENCH, ids=[p.name for p in BENCH])
def test_bench_script_compiles_and_answers_help(script, tmp_path):
    py_compile.compile(str(script), cfile=str(tmp_path / "out.pyc"), doraise=True)
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
