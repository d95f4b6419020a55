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


def test_the_matmul_peak_is_measured_on_the_learners_device():
    """bench_step puts the update against the peak of the device the learner computes on: off the CPU
    only torch's matmul is timed there (oneDNN is a CPU library), never a CPU figure for a GPU update."""
    sys.path.insert(0, str(BENCH[0].parent))
    try:
        import bench_matmul
    finally:
        sys.path.remove(str(BENCH[0].parent))
    assert bench_matmul.available_libraries(device="meta") == ["torch"]
    assert "torch" in bench_matmul.available_libraries(device="cpu")
    with pytest.raises(ValueError, match="CPU library"):
        bench_matmul.product("onednn", 4, 4, 4, device="meta")
    assert bench_matmul.gflops(16, 16, 16, seconds=0.001, repeats=1, device="cpu") > 0


def test_the_no_trim_arm_skips_the_loops_heap_trims(monkeypatch):
    """compare_trl's no-trim arm (the A/B of runtime/host_memory.py) makes the loop's trims no-ops."""
    import polyrl.trainer.loop as loop
    from polyrl.runtime.host_memory import release_freed_host_memory

    monkeypatch.syspath_prepend(str(BENCH[0].parent))
    from compare_trl_parts.workers import skip_host_trims

    monkeypatch.setattr(loop, "release_freed_host_memory", release_freed_host_memory)  # restored after the test
    skip_host_trims()
    assert loop.release_freed_host_memory is not release_freed_host_memory
    assert loop.release_freed_host_memory() is False


def test_the_default_malloc_arm_leaves_glibcs_thresholds_alone(monkeypatch):
    """compare_trl's default-malloc arm (the other A/B of runtime/host_memory.py): the run's set-up
    no longer raises glibc's mmap and trim thresholds, and records that it did not."""
    import polyrl.trainer.build_models as setup
    from polyrl.runtime.host_memory import keep_freed_host_memory

    monkeypatch.syspath_prepend(str(BENCH[0].parent))
    from compare_trl_parts.workers import default_host_allocator

    monkeypatch.setattr(setup, "keep_freed_host_memory", keep_freed_host_memory)  # restored after the test
    default_host_allocator()
    assert setup.keep_freed_host_memory is not keep_freed_host_memory
    assert setup.keep_freed_host_memory().startswith("unchanged")


def test_bench_scale_combines_a_points_rounds(monkeypatch):
    """bench_scale --rounds: a point's step is the median of its rounds, its phases the mean; a
    failed round fails the point."""
    monkeypatch.syspath_prepend(str(BENCH[0].parent))
    import bench_scale

    def run(step_s, generate, share):
        return {
            "point": (2, 1, 0),
            "step_s": step_s,
            "samples": 64.0,
            "sync_share": share,
            "prompts": 8,
            "phases": {"generate": generate},
            "wall_s": 10.0,
        }

    combined = bench_scale.combine([run(1.0, 0.4, 0.1), run(3.0, 0.6, 0.2), run(1.2, 0.5, 0.3)])
    # median of 1.0, 3.0, 1.2 = 1.2; generate (0.4 + 0.6 + 0.5) / 3 = 0.5; share (0.1 + 0.2 + 0.3) / 3 = 0.2
    assert combined["step_s"] == 1.2 and combined["rounds"] == [1.0, 3.0, 1.2]
    assert abs(combined["phases"]["generate"] - 0.5) < 1e-12 and abs(combined["sync_share"] - 0.2) < 1e-12
    assert combined["wall_s"] == 30.0
    failed = {"point": (2, 1, 0), "error": "boom", "wall_s": 1.0}
    assert bench_scale.combine([run(1.0, 0.4, 0.1), failed]) is failed


def test_compare_trl_runs_both_sides_with_the_same_activation_checkpointing(monkeypatch):
    """TRL's GRPOConfig turns gradient checkpointing on by default, polyrl's default is off: the
    bench pins one setting for both sides (before, TRL recomputed its activations and polyrl did
    not, so every speed and memory ratio compared different work)."""
    monkeypatch.syspath_prepend(str(BENCH[0].parent))
    from compare_trl_parts.workers import polyrl_settings, trl_settings

    regime = {"max_tokens": 24}
    for on in (False, True):
        assert polyrl_settings("policy", regime, gradient_checkpointing=on)["train"]["gradient_checkpointing"] is on
        assert trl_settings(regime, 3, gradient_checkpointing=on)["gradient_checkpointing"] is on


def test_trls_own_config_object_keeps_the_pinned_checkpointing(monkeypatch):
    """Where the bench extra is installed, TRL's GRPOConfig built from the bench's settings has the
    value the bench pinned, not its own default (on)."""
    trl = pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(BENCH[0].parent))
    from compare_trl_parts.workers import trl_settings

    regime = {"max_tokens": 24}
    assert trl.GRPOConfig(**trl_settings(regime, 3, gradient_checkpointing=False)).gradient_checkpointing is False
    assert trl.GRPOConfig(**trl_settings(regime, 3, gradient_checkpointing=True)).gradient_checkpointing is True
