"""polyrl submit --address and polyrl jobs: Ray's Job Submission API against a real Ray head
with its dashboard (job server) on 127.0.0.1, started here and stopped at the end."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from run_control import child_env, free_port, polyrl_here
from typer.testing import CliRunner

from tests.ray_support import FAIR_WORKERS_ENV, stop_blocking_head

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


def _polyrl(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", *args],
        cwd=folder,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head with its dashboard on 127.0.0.1, in the foreground (--block) so that stopping it
    stops only its own processes (never `ray stop`, which stops every Ray on the machine). Its
    jobs run `python` from this interpreter's folder, as they would from an activated venv."""
    gcs_port, dashboard_port = free_port(), free_port()
    agent_ports = [
        word
        for option in (
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        for word in (option, str(free_port()))
    ]
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short (AF_UNIX: 107 bytes)
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **FAIR_WORKERS_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this checkout's polyrl, as in the test process
    log = Path(temp_dir) / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("ray")),
                "start",
                "--head",
                "--block",
                "--port",
                str(gcs_port),
                "--node-ip-address",
                "127.0.0.1",
                "--include-dashboard",
                "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(dashboard_port),
                "--num-cpus",
                "2",
                "--disable-usage-stats",
                "--temp-dir",
                temp_dir,
                # The head's agents on free ports too: their defaults (52365 for the job agent) may
                # still be held by a Ray that another test of this worker started, and then the
                # head never gets a job agent ("No available agent to submit job").
                *agent_ports,
            ],
            env=env,
            stdout=out,
            stderr=out,
        )
    deadline = time.time() + 180
    while "Ray runtime started" not in log.read_text() and head.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    try:
        assert head.poll() is None and "Ray runtime started" in log.read_text(), log.read_text()[-3000:]
        yield {"url": f"http://127.0.0.1:{dashboard_port}", "gcs": f"127.0.0.1:{gcs_port}"}
    finally:
        stop_blocking_head(head, temp_dir)


def _job_id(output: str) -> str:
    match = re.search(r"submitted job (polyrl-\S+)", output)
    assert match, output[-3000:]
    return match.group(1)


@pytest.mark.slow
def test_submit_list_follow_and_stop_jobs_on_a_real_ray_head(tmp_path, ray_head, tiny_experiment, write_experiment, monkeypatch):
    url = ray_head["url"]
    # The tiny experiment's MLflow store and checkpoint folder are in tmp_path, the working folder
    # that travels: both are left out of the upload and pinned to these absolute paths.
    path = write_experiment(tmp_path, tiny_experiment(name="jobs", train={"steps": 2}, checkpoint={"every": 2}))

    # 1. Submit and follow (the default --wait): the job's output ends with the run's summary; exit 0.
    done = _polyrl(tmp_path, "submit", path.name, "--address", url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = _job_id(done.stdout)
    assert "python -m polyrl.cli.main run exp.yaml --no-progress" in done.stdout
    assert f"job {first}: SUCCEEDED" in done.stdout
    assert "MLflow:" in done.stdout and "(parent run" in done.stdout  # polyrl run's own summary, streamed back
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (arm_run,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("jobs").experiment_id])
        if r.data.tags.get("polyrl.arm") == "main"
    ]
    assert arm_run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(arm_run.info.run_id, "train/step")] == [1, 2]
    assert (tmp_path / "runs" / "jobs" / "main" / "step_000002").is_dir()  # the checkpoint came home, not into Ray's copy

    # 2. A longer job, submitted without waiting, through the GCS address (its dashboard found via the GCS).
    done = _polyrl(tmp_path, "submit", path.name, "--address", ray_head["gcs"], "--no-wait", "--set", "train.steps=500")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    second = _job_id(done.stdout)
    assert f"polyrl jobs stop {second}" in done.stdout

    # The jobs commands in this process (each subprocess costs seconds of imports); the client
    # turns Ray's token mode on as a subprocess would, undone at the end of the test.
    monkeypatch.setenv("RAY_AUTH_MODE", "token" if (Path.home() / ".ray" / "auth_token").exists() else "disabled")

    def jobs(*args: str) -> tuple[int, str]:
        done = polyrl_here(tmp_path, monkeypatch, "jobs", *args, "--address", url)
        return done.returncode, done.stdout + done.stderr

    code, listed = jobs("list")
    assert code == 0, listed[-3000:]
    rows = {line.split("│")[1].strip(): line for line in listed.splitlines() if "polyrl-jobs-" in line}
    assert set(rows) == {first, second}, listed
    assert "SUCCEEDED" in rows[first] and re.search(r"PENDING|RUNNING", rows[second]), listed

    code, stopped = jobs("stop", second)
    assert code == 0 and f"job {second}: STOPPED" in stopped, stopped[-3000:]
    code, logs = jobs("logs", first)
    assert code == 0 and "(parent run" in logs, logs[-3000:]
    code, followed = jobs("logs", second, "--follow")  # an ended job: its logs, its status
    assert code == 1 and f"job {second}: STOPPED" in followed, followed[-2000:]

    code, unknown = jobs("logs", "polyrl-no-such-job")
    assert code == 2 and "job polyrl-no-such-job: Job polyrl-no-such-job does not exist" in unknown, unknown[-3000:]


@pytest.mark.parametrize("command", [("submit", "exp.yaml", "--address"), ("jobs", "list", "--address")])
def test_an_unreachable_job_server_fails_in_seconds_naming_it(tmp_path, tiny_experiment, write_experiment, command):
    write_experiment(tmp_path, tiny_experiment())
    port = free_port()  # nothing listens there
    started = time.monotonic()
    done = _polyrl(tmp_path, *command, f"http://127.0.0.1:{port}", timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in done.stderr and "ray start --head" in done.stderr
    # The bound allows a loaded CI machine's interpreter start (17 s seen); Ray's own connection
    # retries, which the address probe spares the user, take minutes.
    assert elapsed < 45, elapsed
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_no_wait_without_an_address_is_refused_naming_the_option(tmp_path, tiny_experiment, write_experiment):
    from polyrl.cli.main import app

    path = write_experiment(tmp_path, tiny_experiment())
    result = CliRunner().invoke(app, ["submit", str(path), "--no-wait"])
    assert result.exit_code == 2
    assert "--no-wait submits the experiment as a Ray job and needs the cluster's address: --address http://127.0.0.1:8265" in (
        result.output
    )


def test_job_entrypoint_and_output_paths(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    from polyrl.config.schema import load_experiment
    from polyrl.launch.ray_jobs import _inside, job_entrypoint, output_overrides

    assert job_entrypoint("exp.yaml", ["train.steps=5", "rollout.engine=hf"], "0,1", True) == (
        "python -m polyrl.cli.main run exp.yaml --no-progress --set train.steps=5 --set rollout.engine=hf --seeds 0,1 --many-runs"
    )
    monkeypatch.chdir(tmp_path)  # polyrl submit's working folder
    config = tiny_experiment(tracking={"uri": "sqlite:///mlflow.db"}, checkpoint={"dir": "out"})
    (first,) = load_experiment(write_experiment(tmp_path, config)).values()
    overrides, uri = output_overrides(first, tmp_path)
    # Relative outputs would land in the job's temporary copy of the working folder: pinned here.
    assert overrides == [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"checkpoint.dir={tmp_path / 'out'}"]
    assert uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tiny_experiment(tracking={"uri": "http://mlflow.example:5000"}, checkpoint={"dir": "/shared/runs"})
    (first,) = load_experiment(write_experiment(tmp_path, config)).values()
    assert output_overrides(first, tmp_path) == ([], "http://mlflow.example:5000")  # a server and an absolute folder: as they are
    assert _inside(tmp_path / "out", tmp_path) == ["/out"] and _inside(Path("/elsewhere"), tmp_path) == []
    assert _inside(tmp_path, tmp_path) == []  # checkpoint.dir "." must not exclude the whole folder


@pytest.mark.parametrize("command", [("submit", "exp.yaml", "--address"), ("jobs", "list", "--address")])
def test_a_job_server_that_accepts_but_never_answers_fails_in_seconds(tmp_path, tiny_experiment, write_experiment, command):
    """A real listening socket that never accepts: the kernel completes every TCP handshake (the
    address probe passes), and the client's first request gets no reply."""
    write_experiment(tmp_path, tiny_experiment())
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        started = time.monotonic()
        done = _polyrl(tmp_path, *command, f"http://127.0.0.1:{port}", timeout=90)  # without request timeouts: hangs
        elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"--address http://127.0.0.1:{port}: the job server at http://127.0.0.1:{port} did not answer within 5 s" in (
        " ".join(done.stderr.split())
    ), done.stderr[-3000:]
    assert elapsed < 60, elapsed  # 5 s of reply timeout, plus the CLI's start (17 s seen on a loaded CI machine)
    assert not list(tmp_path.rglob("step_*"))  # nothing was run


def test_a_job_server_that_stops_answering_after_the_version_check_fails_with_the_request_named():
    """A real HTTP server on 127.0.0.1 that answers the client's version check, then never
    answers the job list: the request times out (reply_timeout_s) with a message, no hang."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import ray

    from polyrl.launch.ray_jobs import RayUnreachableError, job_client, list_jobs

    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/api/version":
                body = json.dumps({"version": "4", "ray_version": ray.__version__, "ray_commit": ""}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                release.wait(60)  # the hung request

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = job_client(f"http://127.0.0.1:{server.server_address[1]}")
        client.reply_timeout_s = 1.0
        started = time.monotonic()
        with pytest.raises(RayUnreachableError, match=r"did not answer within 1 s \(GET /api/jobs/\)"):
            list_jobs(client)
        assert time.monotonic() - started < 10
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_submission_waits_for_a_just_started_heads_job_agent(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    """A head that has just started answers a submission with "No available agent to submit job,
    please try again later" until its job agent is up (it failed the real-head test above once on
    a loaded machine). The submission waits for the agent within AGENT_WAIT_S; any other refusal,
    or the agent still missing after the wait, is the error it was. The client here stands in for
    Ray's JobSubmissionClient only at the request (the real one runs in the test above)."""
    from polyrl.launch import ray_jobs

    class Client:
        def __init__(self, refusals: list[str]):
            self.refusals, self.calls = list(refusals), 0

        def get_address(self):
            return "http://127.0.0.1:8265"

        def submit_job(self, **request):
            self.calls += 1
            if self.refusals:
                raise RuntimeError(f"Request failed with status code 500: {self.refusals.pop(0)}.")
            return request["submission_id"]

    no_agent = "No available agent to submit job, please try again later"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_jobs.time, "sleep", lambda s: None)
    path = write_experiment(tmp_path, tiny_experiment())

    def submit(client: Client) -> tuple[list[str], object]:
        monkeypatch.setattr(ray_jobs, "job_client", lambda address: client)
        said: list[str] = []
        return said, ray_jobs.submit_job(path, address="http://127.0.0.1:8265", echo=said.append)

    client = Client([no_agent, no_agent])
    said, job = submit(client)
    assert client.calls == 3 and job.job_id.startswith("polyrl-tiny-")  # before: the first refusal was the error
    assert said == ["waiting for the cluster's job agent at http://127.0.0.1:8265 (up to 60 s)"] * 2
    # Another refusal is not waited on.
    client = Client(["Job with submission_id x already exists", no_agent])
    with pytest.raises(ray_jobs.JobError, match="already exists"):
        submit(client)
    assert client.calls == 1
    # Nor is an agent that never comes, past the wait.
    monkeypatch.setattr(ray_jobs, "AGENT_WAIT_S", -1.0)
    client = Client([no_agent] * 5)
    with pytest.raises(ray_jobs.JobError, match="No available agent"):
        submit(client)
    assert client.calls == 1
