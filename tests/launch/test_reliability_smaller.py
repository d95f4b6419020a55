"""Smaller reliability gaps: a large ``seeds:`` count is stated and wants ``--many-runs``;
``polyrl eval run:<arm run>`` of a seeded experiment names the seed runs; ``polyrl submit
--address`` to a Ray head with token authentication sends the token, or says that
authentication failed and how to pass it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.tracking.mlflow_runs import ExperimentTracker
from tests.ray_support import FAIR_WORKERS_ENV, stop_blocking_head

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


def _invoke(folder: Path, monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.output.split())


def test_a_large_seed_count_is_stated_and_needs_many_runs(tmp_path, monkeypatch):
    config = {
        "name": "many",
        "seeds": 1000,
        "arms": {"a": {}, "b": {}},
        "train": {"steps": 20},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    code, output = _invoke(tmp_path, monkeypatch, "validate", str(path))
    # Before: "ok" for each arm and not a word about 2000 runs.
    assert code == 0, output
    assert "runs: 2 arm(s) × 1000 seed(s) = 2,000 training runs, 40,000 training steps in all" in output, output
    assert "more than 100 runs" in output and "--many-runs" in output
    code, output = _invoke(tmp_path, monkeypatch, "run", str(path))
    assert code == 2 and "more than 100 runs in one command" in output and "did you mean seed: N" in output, output
    assert not (tmp_path / "mlflow.db").exists()


def test_eval_of_a_seeded_arm_run_names_its_seed_runs(tmp_path):
    from polyrl.evals.models import resolve_model
    from polyrl.evals.suite import EvalError

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = ExperimentTracker(uri, "seeded")
    parent = tracker.start_parent("seeded")
    arm = tracker.start_arm(parent.run_id, "grpo", tags={"polyrl.seeds": "0,1"})
    seeds = [tracker.start_arm(arm.run_id, "grpo", seed=seed) for seed in (0, 1)]
    with pytest.raises(EvalError) as caught:
        resolve_model(f"run:{arm.run_id}", tracking_uri=uri, cache_dir=tmp_path / "cache")
    said = str(caught.value)
    # Before: "has no polyrl.checkpoint_dir tag (is it a polyrl training arm run?)".
    assert f"run {arm.run_id} is arm 'grpo''s run over its seeds" in said, said
    assert f"seed 0: run:{seeds[0].run_id}" in said and f"seed 1: run:{seeds[1].run_id}" in said
    assert f"--model run:{seeds[0].run_id} --model run:{seeds[1].run_id}" in said
    with pytest.raises(EvalError, match=f"arm grpo: run:{arm.run_id}"):
        resolve_model(f"run:{parent.run_id}", tracking_uri=uri, cache_dir=tmp_path / "cache")


CONNECT = textwrap.dedent(
    """\
    import sys
    import ray
    from polyrl.core.errors import PolyrlError
    from polyrl.launch.ray_submit import check_ray_token
    try:
        check_ray_token(sys.argv[1])
    except PolyrlError as error:
        print("refused:", error)
        raise SystemExit(0)
    ray.init(address=sys.argv[1], logging_level="ERROR")
    print("connected", int(ray.cluster_resources()["CPU"]))
    """
)


@pytest.fixture
def token_ray_head(tmp_path):
    """A Ray head with token authentication (its token in <home>/.ray/auth_token) on loopback, run
    in the foreground (--block) so that stopping it stops only its own processes."""
    home = tmp_path / "head_home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", **FAIR_WORKERS_ENV}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "head.log"
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short (AF_UNIX: 107 bytes)
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("ray")),
                "start",
                "--head",
                "--block",
                "--port",
                str(port),
                "--num-cpus",
                "1",
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
                "--temp-dir",
                temp_dir,
            ],
            env=env,
            stdout=out,
            stderr=out,
        )
    deadline = time.time() + 180
    while "Ray runtime started" not in log.read_text() and head.poll() is None and time.time() < deadline:
        time.sleep(0.5)  # --block prints its banner once the head is up, then waits
    try:
        assert head.poll() is None and "Ray runtime started" in log.read_text(), log.read_text()[-3000:]
        address = re.search(r"ray start --address='([^']+)'", log.read_text()).group(1)
        yield address, home
    finally:
        stop_blocking_head(head, temp_dir)


@pytest.mark.slow
def test_submit_address_sends_the_ray_token_or_says_authentication_failed(tmp_path, token_ray_head):
    address, head_home = token_ray_head

    def connect(home: Path) -> str:
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
        for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(key, None)
        done = subprocess.run([sys.executable, "-c", CONNECT, address], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return " ".join(done.stdout.split())

    # The token in ~/.ray/auth_token is sent (before: "cannot reach a Ray cluster" after ~20 s).
    assert connect(head_home) == "connected 1"
    wrong, none = tmp_path / "wrong", tmp_path / "none"
    (wrong / ".ray").mkdir(parents=True)
    (wrong / ".ray" / "auth_token").write_text(uuid.uuid4().hex)
    none.mkdir()
    said = connect(wrong)
    assert said.startswith(
        f"refused: --address {address}: the Ray cluster requires token authentication and the token polyrl found was refused"
    ), said
    assert "RAY_AUTH_TOKEN=<token>" in said
    said = connect(none)
    assert "polyrl found no token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) to send" in said, said
    shutil.rmtree(wrong)
