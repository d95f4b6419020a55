"""Reliability end to end: real `polyrl` processes killed, interrupted, run twice, starved of disk
or pointed at services that are not there. Each test asserts what the user sees (exit code, one
message, no traceback) and what is left behind (checkpoints, MLflow runs, metrics, params)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from run_control import child_env, free_port, polyrl_here, run_child, start_child, wait_for

from polyrl.tracking.mlflow_runs import STEP_MARKER

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.mlflow_server]

COMPARED = ["reward/mean", "actor/loss", "rollout/response_length/mean"]


def _polyrl(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", *args],
        cwd=folder,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _child(folder: Path, action: str, at: int, *args: str) -> subprocess.CompletedProcess:
    return run_child(folder, child_env(), action, at, *args)


def _killed_by(folder: Path, action: str, at: int, path: Path) -> Path:
    """Run ``path`` until ``action`` SIGKILLs it at step ``at``; the arm's checkpoint folder."""
    killed = _child(folder, action, at, str(path), "--no-progress")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return folder / "runs" / "rel" / "main"


def _child_popen(folder: Path, action: str, at: int, *args: str) -> subprocess.Popen:
    return start_child(folder, child_env(), action, at, *args)


def _experiment(tiny_experiment, write_experiment, folder: Path, name: str = "rel", **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_experiment(
        name=name,
        train={"steps": 6, "learning_rate": 3e-3, "micro_batch_size": 8},
        tracking={"uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False},
        checkpoint={"dir": str(folder / "runs"), "every": 2, "keep": 2},
    )
    for key, value in overrides.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    return write_experiment(folder, config)


def _client(folder: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def _runs(client: MlflowClient, experiment: str, role: str):
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], filter_string=f"tags.`polyrl.role` = '{role}'") if found else []


def _only_arm_run(client: MlflowClient, experiment: str = "rel"):
    runs = _runs(client, experiment, "arm")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _steps(client: MlflowClient, run_id: str, key: str = STEP_MARKER) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _checkpoints(arm_dir: Path) -> list[str]:
    return sorted(p.name for p in arm_dir.iterdir() if p.name.startswith("step_")) if arm_dir.is_dir() else []


def _clean_error(process: subprocess.CompletedProcess, code: int, *phrases: str) -> str:
    output = process.stdout + process.stderr
    assert process.returncode == code, (process.returncode, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    for phrase in phrases:
        assert phrase in process.stderr, (phrase, process.stderr[-3000:])
    return process.stderr


def _assert_all_steps_once(client: MlflowClient, run_id: str, steps: int) -> None:
    for key in [STEP_MARKER, *COMPARED]:
        assert _steps(client, run_id, key) == list(range(1, steps + 1)), key  # none missing, none twice


# --- 1. a kill right after a checkpoint loses no step -------------------------------------------


@pytest.mark.slow
def test_sigkill_right_after_a_checkpoint_then_resume_logs_every_step_once(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    path = _experiment(tiny_experiment, write_experiment, tmp_path)
    arm_dir = _killed_by(tmp_path, "kill_after_save", 4, path)
    assert _checkpoints(arm_dir) == ["step_000002", "step_000004"]
    client = _client(tmp_path)
    # Step 4's metrics reached MLflow before its checkpoint was written.
    assert _steps(client, _only_arm_run(client).info.run_id) == [1, 2, 3, 4]

    resumed = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    assert "taking over the lock of a run that is gone" in resumed.stdout  # the killed run's lock
    run = _only_arm_run(client)
    assert run.info.status == "FINISHED"
    _assert_all_steps_once(client, run.info.run_id, 6)


# --- 2. a complete .partial checkpoint is ignored everywhere and cleaned -----------------------


@pytest.mark.slow
def test_killed_between_marker_and_rename_resume_and_eval_ignore_the_partial(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    from polyrl.evals.models import resolve_model

    path = _experiment(tiny_experiment, write_experiment, tmp_path)
    arm_dir = _killed_by(tmp_path, "kill_before_rename", 4, path)
    assert _checkpoints(arm_dir) == ["step_000002", "step_000004.partial"]
    assert (arm_dir / "step_000004.partial" / "checkpoint.json").is_file()  # complete but for the rename

    client = _client(tmp_path)
    run_id = _only_arm_run(client).info.run_id
    resolved = resolve_model(f"run:{run_id}", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", cache_dir=tmp_path / "cache")
    assert resolved.step == 2

    resumed = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stdout
    assert _checkpoints(arm_dir) == ["step_000004", "step_000006"]  # the partial is gone, keep=2
    _assert_all_steps_once(client, run_id, 6)


# --- 3. disk full while writing a checkpoint ---------------------------------------------------


@pytest.fixture
def small_disk(tmp_path, random_policy_dir):
    """A real tmpfs sized between one and two checkpoints of the tiny policy (weights plus two
    Adam moments, ~3× the model file), so the second checkpoint hits ENOSPC mid-write."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    size = int(4.5 * (random_policy_dir / "model.safetensors").stat().st_size)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs needs root (CAP_SYS_ADMIN): {done.stderr.strip() or done.returncode}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.slow
def test_disk_full_mid_checkpoint_fails_cleanly_and_resumes_once_space_is_back(
    tmp_path, small_disk, tiny_experiment, write_experiment
):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, checkpoint={"dir": str(small_disk), "every": 2, "keep": 1})
    full = _polyrl(tmp_path, "run", str(path), "--no-progress")
    arm_dir = small_disk / "rel" / "main"
    stderr = _clean_error(
        full,
        2,
        "could not write checkpoint step_000004",
        "No space left on device",
        "the disk is full",
        "step_000002, is kept",
        f"Continue with: polyrl run {path} --resume",
    )
    assert stderr.count("error") == 1
    assert _checkpoints(arm_dir) == ["step_000002"]  # no partial left using the space
    client = _client(tmp_path)
    run = _only_arm_run(client)
    assert run.info.status == "FAILED"
    assert "could not write checkpoint step_000004" in run.data.tags["polyrl.error"]
    parent = _runs(client, "rel", "experiment")[0]
    assert parent.info.status == "FAILED" and "arm 'main': could not write checkpoint" in parent.data.tags["polyrl.error"]

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    resumed = _polyrl(tmp_path, "run", str(path), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stdout
    run = _only_arm_run(client)
    assert run.info.status == "FINISHED"
    _assert_all_steps_once(client, run.info.run_id, 6)
    assert _checkpoints(arm_dir) == ["step_000006"]


# --- 5. MLflow server down at start ------------------------------------------------------------


def test_mlflow_server_down_at_start_is_one_message_in_seconds(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    # "In seconds" is checked as behaviour, not wall time (a loaded CI machine took 17 s just to
    # start the process): one probe of /health bounded by the probe timeout, and no MLflow HTTP
    # call at all, whose retries with backoff are what could take minutes.
    import mlflow.utils.rest_utils as rest_utils

    import polyrl.tracking.connection as connection

    probes: list[tuple[str, float]] = []
    real_urlopen = connection.urllib.request.urlopen

    def recording_urlopen(url, *args, timeout=None, **kwargs):
        probes.append((url, timeout))
        return real_urlopen(url, *args, timeout=timeout, **kwargs)

    def no_mlflow_call(*args, **kwargs):
        raise AssertionError(f"an MLflow HTTP call was made to a server known to be down: {args[1:3] or kwargs}")

    monkeypatch.setattr(connection.urllib.request, "urlopen", recording_urlopen)
    monkeypatch.setattr(rest_utils, "http_request", no_mlflow_call)
    uri = f"http://127.0.0.1:{free_port()}"
    path = _experiment(tiny_experiment, write_experiment, tmp_path, tracking={"uri": uri})
    done = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--no-progress")
    _clean_error(done, 2, f"cannot reach MLflow at {uri}", "nothing was trained or logged")
    assert probes == [(f"{uri}/health", connection.PROBE_TIMEOUT_S)]
    assert not (tmp_path / "runs").exists()  # before the experiment folder, any model or any run


# --- 6. --resume with a changed config ---------------------------------------------------------


@pytest.mark.slow
def test_resume_refuses_a_changed_config_unless_allowed_and_then_applies_and_records_it(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, train={"steps": 4})
    assert _child(tmp_path, "kill_after_save", 2, str(path), "--no-progress").returncode == -signal.SIGKILL
    client = _client(tmp_path)
    run_id = _only_arm_run(client).info.run_id
    arm_dir = tmp_path / "runs" / "rel" / "main"
    change = ["--set", "train.learning_rate=0.001", "--set", "objective.name=dr_grpo"]

    refused = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--resume", "--no-progress", *change)
    _clean_error(
        refused,
        2,
        "train.learning_rate: 0.003 → 0.001",
        "objective.name: 'grpo' → 'dr_grpo'",
        "arm 'main' (resumes after step 2)",
        "--allow-config-change",
    )
    frozen = polyrl_here(
        tmp_path,
        monkeypatch,
        "run",
        str(path),
        "--resume",
        "--no-progress",
        "--allow-config-change",
        "--set",
        "seed=1",
        "--set",
        "data.limit=5",
    )
    _clean_error(frozen, 2, "cannot apply to a resumed run", "seed: 0 → 1", "data.limit: None → 5")
    assert _steps(client, run_id) == [1, 2] and _checkpoints(arm_dir) == ["step_000002"]  # nothing trained meanwhile

    allowed = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--resume", "--no-progress", "--allow-config-change", *change)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "applying config changes from step 3" in allowed.stdout
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["polyrl.config_change.step_000002"] == (
        "objective.name: 'grpo' → 'dr_grpo'; train.learning_rate: 0.003 → 0.001"
    )
    assert run.data.params["train.learning_rate"] == "0.003"  # params are what the run started with
    original = yaml.safe_load(Path(client.download_artifacts(run_id, "resolved_config.yaml", str(tmp_path))).read_text())
    changed = yaml.safe_load(
        Path(client.download_artifacts(run_id, "resolved_config.resume_step_000002.yaml", str(tmp_path))).read_text()
    )
    assert original["train"]["learning_rate"] == 0.003 and changed["train"]["learning_rate"] == 0.001
    assert changed["objective"]["name"] == "dr_grpo"
    # The new rate reached the optimizer itself, not only the logged metric.
    lrs = {m.step: m.value for m in client.get_metric_history(run_id, "actor/learning_rate")}
    assert lrs[2] == pytest.approx(0.003) and lrs[3] == pytest.approx(0.001) and lrs[4] == pytest.approx(0.001)
    import json

    groups = json.loads((arm_dir / "step_000004" / "policy_optimizer.json").read_text())["param_groups"]
    assert all(group["lr"] == pytest.approx(0.001) for group in groups)
    assert json.loads((arm_dir / "step_000004" / "checkpoint.json").read_text())["config"]["objective"]["name"] == "dr_grpo"
    _assert_all_steps_once(client, run_id, 4)


# --- 8. two runs of one experiment in one folder ------------------------------------------------


@pytest.mark.slow
def test_a_second_run_in_the_same_folder_is_refused_while_the_first_runs(tmp_path, tiny_experiment, write_experiment):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, train={"steps": 4})
    first = _child_popen(tmp_path, "hold_after_step", 1, str(path), "--no-progress")
    try:
        wait_for(tmp_path / "at_step_1", first)
        for extra in ([], ["--resume"]):
            second = _polyrl(tmp_path, "run", str(path), "--no-progress", *extra, timeout=120)
            _clean_error(second, 2, "experiment 'rel' is already running", f"pid {first.pid} on host")
        (tmp_path / "go").touch()
        out, err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, err[-3000:]
    assert not list((tmp_path / "runs").glob("rel.previous-*"))  # the second run moved nothing aside
    assert _checkpoints(tmp_path / "runs" / "rel" / "main") == ["step_000002", "step_000004"]
    client = _client(tmp_path)
    run = _only_arm_run(client)  # the refused runs created no MLflow run
    assert run.info.status == "FINISHED" and _steps(client, run.info.run_id) == [1, 2, 3, 4]


# --- 9. SIGTERM is Ctrl-C ----------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_marks_runs_killed_and_resumes(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, train={"steps": 6}, checkpoint={"every": 100})
    process = _child_popen(tmp_path, "pause_after_step", 2, str(path), "--no-progress")
    try:
        wait_for(tmp_path / "at_step_2", process)
        process.send_signal(signal.SIGTERM)  # during step 2's pause: honoured when step 3 ends
        out, err = process.communicate(timeout=600)
    finally:
        process.kill()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    arm_dir = tmp_path / "runs" / "rel" / "main"
    _clean_error(
        done,
        128 + signal.SIGTERM,
        "stopped by SIGTERM after step 3 of arm 'main'",
        f"checkpoint {arm_dir / 'step_000003'} saved",
        "marked KILLED",
        f"Continue with: polyrl run {path} --resume",
    )
    assert "SIGTERM received: stopping after the current step" in out
    assert _checkpoints(arm_dir) == ["step_000003"]
    client = _client(tmp_path)
    run = _only_arm_run(client)
    assert run.info.status == "KILLED" and _runs(client, "rel", "experiment")[0].info.status == "KILLED"
    assert _steps(client, run.info.run_id) == [1, 2, 3]

    resumed = polyrl_here(tmp_path, monkeypatch, "run", str(path), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 3" in resumed.stdout
    assert _only_arm_run(client).info.status == "FINISHED"
    _assert_all_steps_once(client, run.info.run_id, 6)


# --- 10. polyrl submit to a cluster that is not there ------------------------------------------


@pytest.mark.parametrize("form", ["ray://127.0.0.1:{port}", "127.0.0.1:{port}"])
def test_submit_to_an_unreachable_ray_address_fails_in_seconds_naming_it(tmp_path, tiny_experiment, write_experiment, form):
    address = form.format(port=free_port())
    path = _experiment(tiny_experiment, write_experiment, tmp_path)
    started = time.monotonic()
    done = _polyrl(tmp_path, "submit", str(path), "--address", address, timeout=120)
    elapsed = time.monotonic() - started
    _clean_error(done, 2, f"--address {address}: cannot reach a Ray cluster at 127.0.0.1:", "ray start --head")
    # The bound allows a loaded CI machine's interpreter start (17 s seen); Ray's own connection
    # retries, which the address probe spares the user, take minutes.
    assert elapsed < 45, elapsed
    assert not (tmp_path / "runs").exists() and _runs(_client(tmp_path), "rel", "arm") == []


# --- 7. polyrl eval run:<A> never evaluates run B's weights ------------------------------------


def test_eval_run_ref_finds_its_own_weights_after_a_later_run_reused_the_folder(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    import shutil

    from polyrl.evals.models import resolve_model
    from polyrl.evals.suite import EvalError
    from polyrl.launch.runner import run_experiment

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = _experiment(tiny_experiment, write_experiment, tmp_path, train={"steps": 2})
    first = run_experiment(path, show_progress=False).arm_run_ids["main"]
    # A second run with other weights (another learning rate) reuses runs/rel/main.
    second = run_experiment(path, set_options=["train.learning_rate=0.02"], show_progress=False).arm_run_ids["main"]
    folder = tmp_path / "runs" / "rel" / "main"
    (archived,) = (tmp_path / "runs").glob("rel.previous-*")
    client = _client(tmp_path)
    assert client.get_run(first).data.tags["polyrl.checkpoint_dir"] == str((archived / "main").resolve())

    def weights(model_dir: Path) -> bytes:
        return (model_dir / "model.safetensors").read_bytes()

    a = resolve_model(f"run:{first}", tracking_uri=uri, cache_dir=tmp_path / "cache")
    b = resolve_model(f"run:{second}", tracking_uri=uri, cache_dir=tmp_path / "cache")
    assert weights(a.path) == (archived / "main" / "step_000002" / "policy.safetensors").read_bytes()
    assert weights(b.path) == (folder / "step_000002" / "policy.safetensors").read_bytes()
    assert weights(a.path) != weights(b.path)

    # A tag still naming the reused folder (as before runs were re-pointed) finds the archived copy.
    client.set_tag(first, "polyrl.checkpoint_dir", str(folder.resolve()))
    shutil.rmtree(tmp_path / "cache")
    assert weights(resolve_model(f"run:{first}", tracking_uri=uri, cache_dir=tmp_path / "cache").path) == weights(a.path)
    # With the archive gone, the folder holds only the second run's weights: refused, naming it.
    shutil.rmtree(archived)
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(EvalError, match=rf"belong to another run \({second}\), not {first}"):
        resolve_model(f"run:{first}", tracking_uri=uri, cache_dir=tmp_path / "cache")
