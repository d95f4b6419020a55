"""seeds_at_once: seed runs trained side by side, each in a process of its own; a seed's metrics
are those of the same seed trained alone at the same thread count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient
from run_control import child_env

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.config.seeds import seeds_at_once_setting
from polyrl.launch.arm_runs import ArmFailedError
from polyrl.launch.runner import run_experiment
from polyrl.launch.units_at_once import resolve_at_once

# A reward that sleeps a little (so a signal lands mid-run) or raises (a unit that fails).
REWARDS = """import time
from polyrl.rewards import RewardModule


class Slow(RewardModule):
    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep

    def score(self, batch):
        time.sleep(self.sleep)
        return [float(len(c)) / 16 for c in batch.completions]


class Broken(RewardModule):
    def score(self, batch):
        raise ValueError("broken on purpose")
"""


def _training_metrics(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every logged metric but those that time the run (they differ between any two runs)."""
    keys = client.get_run(run_id).data.metrics
    timed = [k for k in keys if k.startswith(("perf/", "time/", "system/")) or k.endswith("_s") or "seconds" in k or "per_s" in k]
    return {
        key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
        for key in keys
        if key not in timed
    }


# --- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, option, message",
    [
        ({"seeds_at_once": 0}, None, r"seeds_at_once: got 0; allowed: auto .* or a whole number >= 1"),
        ({"seeds_at_once": "many"}, None, r"seeds_at_once: got 'many'"),
        ({"seeds_at_once": True}, None, r"seeds_at_once: got True"),
        ({}, "two", r"--seeds-at-once 'two': got 'two'"),
    ],
)
def test_a_bad_seeds_at_once_is_refused_naming_the_field_and_the_allowed_values(raw, option, message):
    with pytest.raises(ConfigError, match=message):
        seeds_at_once_setting(raw, source="exp.yaml", option=option)


def test_seeds_at_once_reads_the_file_and_the_option_wins():
    assert seeds_at_once_setting({}) == "auto"
    assert seeds_at_once_setting({"seeds_at_once": 3}) == 3
    assert seeds_at_once_setting({"seeds_at_once": 3}, option="1") == 1
    assert seeds_at_once_setting({}, option="auto") == "auto"


def _configs(tiny_experiment, **arm_overrides):
    raw = tiny_experiment()
    raw["arms"] = {"a": arm_overrides, "b": {}}
    return resolve_arms(raw)


def test_auto_is_two_on_a_cpu_machine_with_seeds_and_one_where_it_would_not_pay(tiny_experiment):
    configs = _configs(tiny_experiment)
    assert resolve_at_once("auto", configs, [0, 1], cores=2) == (2, "auto: 2 CPU cores")
    assert resolve_at_once("auto", configs, None, cores=2)[0] == 1  # one run per arm, as before
    assert resolve_at_once("auto", configs, [0, 1], cores=1) == (1, "one core")
    spread = _configs(tiny_experiment, rollout={"workers": 2})
    assert resolve_at_once("auto", spread, [0, 1], cores=2) == (1, "arms.a.rollout.workers > 1 starts processes of its own")
    assert resolve_at_once(1, configs, [0, 1], cores=2) == (1, "as set")


@pytest.mark.parametrize(
    "setting, seeds, overrides, message",
    [
        (2, None, {}, r"seeds_at_once: 2: .* this experiment has no seeds"),
        (3, [0, 1], {}, r"seeds_at_once: 3: more than this machine's 2 cores .* allowed: 1 to 2, or auto"),
        (2, [0, 1], {"rollout": {"workers": 2}}, r"arms.a.rollout.workers > 1 starts processes of its own"),
    ],
)
def test_a_number_that_cannot_work_here_is_refused(tiny_experiment, setting, seeds, overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_at_once(setting, _configs(tiny_experiment, **overrides), seeds, cores=2)


def test_submit_refuses_seeds_at_once(tmp_path, tiny_experiment, write_experiment):
    from polyrl.launch.ray_submit import submit_experiment

    config = tiny_experiment(seeds_at_once=2)
    config.pop("seed")
    config["seeds"] = 2
    with pytest.raises(ConfigError, match="seeds_at_once: 2 is polyrl run's; polyrl submit .* --cpus-per-arm"):
        submit_experiment(write_experiment(tmp_path, config))


# --- runs side by side ---------------------------------------------------------------------------


def _seeded(tiny_experiment, name: str, at_once: int, **overrides) -> dict:
    config = tiny_experiment(name=name, train={"steps": 3, "threads": 1}, **overrides)
    config.pop("seed")
    config["seeds"] = [0, 1]
    config["seeds_at_once"] = at_once
    return config


@pytest.mark.slow
def test_seeds_side_by_side_train_what_they_train_one_after_another(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    side = run_experiment(write_experiment(tmp_path, _seeded(tiny_experiment, "side", 2)), show_progress=False)
    alone = run_experiment(write_experiment(tmp_path, _seeded(tiny_experiment, "alone", 1)), show_progress=False)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for key in ("main/seed_0", "main/seed_1"):
        side_run, alone_run = client.get_run(side.seed_run_ids[key]), client.get_run(alone.seed_run_ids[key])
        assert side_run.info.status == alone_run.info.status == "FINISHED"
        assert side_run.data.params["train.threads"] == alone_run.data.params["train.threads"] == "1"
        side_metrics = _training_metrics(client, side_run.info.run_id)
        assert side_metrics["reward/mean"][-1][0] == 3  # every step logged
        assert side_metrics == _training_metrics(client, alone_run.info.run_id)  # to the last bit
        assert side.final_metrics[key]["reward/mean"] == alone.final_metrics[key]["reward/mean"]
    # The two seeds differ from each other (the check above would pass for any two copies of one run).
    assert _training_metrics(client, side.seed_run_ids["main/seed_0"]) != _training_metrics(
        client, side.seed_run_ids["main/seed_1"]
    )
    arm_run = client.get_run(side.arm_run_ids["main"])
    assert arm_run.info.status == "FINISHED" and arm_run.data.metrics["seeds/n"] == 2
    state = json.loads((tmp_path / "runs" / "side" / "experiment.json").read_text())
    assert sorted(state["finished"]) == ["main/seed_0", "main/seed_1"]
    assert "main" in state["arms_finished"]
    log = (tmp_path / "runs" / "side" / "polyrl.log").read_text()
    assert log.count("(side by side, pid") == 2  # each unit's library logs: in the experiment's log file


@pytest.mark.slow
def test_a_unit_that_fails_side_by_side_is_named_and_the_other_finishes(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARDS)
    config = _seeded(tiny_experiment, "mixed", 2)
    config["seeds"] = [0]
    config["arms"] = {"good": {}, "broken": {"rewards": [{"module": f"{tmp_path / 'rewards.py'}:Broken"}]}}
    with pytest.raises(ArmFailedError, match="broken/seed_0") as info:
        run_experiment(write_experiment(tmp_path, config), show_progress=False)
    result = info.value.result
    assert "broken on purpose" in result.failed["broken/seed_0"] and "good/seed_0" not in result.failed
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(result.seed_run_ids["good/seed_0"]).info.status == "FINISHED"
    assert client.get_run(result.seed_run_ids["broken/seed_0"]).info.status == "FAILED"
    assert client.get_run(result.parent_run_id).info.status == "FAILED"


@pytest.mark.slow
def test_sigterm_stops_every_unit_with_a_checkpoint_and_a_resume_finishes_them(tmp_path, tiny_experiment, write_experiment):
    (tmp_path / "rewards.py").write_text(REWARDS)
    config = _seeded(
        tiny_experiment, "stopped", 2, rewards=[{"module": f"{tmp_path / 'rewards.py'}:Slow", "params": {"sleep": 0.5}}]
    )
    config["train"]["steps"] = 8
    config["checkpoint"]["every"] = 100
    path = write_experiment(tmp_path, config)
    command = [sys.executable, "-m", "polyrl.cli.main", "run", str(path), "--no-progress"]
    process = subprocess.Popen(command, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.time() + 300
        while not any("seed_0 step 1/8" in line for line in lines):
            line = process.stdout.readline()
            assert line or process.poll() is None, "".join(lines) + process.stderr.read()
            lines.append(line)
            assert time.time() < deadline
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    out = "".join(lines) + out
    assert process.returncode == 128 + signal.SIGTERM, out + err
    assert "SIGTERM received: stopping after the current step" in out
    assert f"Continue with: polyrl run {path} --resume" in err
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    state = json.loads((tmp_path / "runs" / "stopped" / "experiment.json").read_text())
    stopped_at = {}
    for key in ("main/seed_0", "main/seed_1"):
        run = client.get_run(state["runs"][key])
        assert run.info.status == "KILLED"
        checkpoints = sorted(p.name for p in (tmp_path / "runs" / "stopped" / key).glob("step_*"))
        assert len(checkpoints) == 1 and checkpoints[0] != "step_000008"  # stopped before the end, with a checkpoint
        stopped_at[key] = int(checkpoints[0].removeprefix("step_"))
    assert client.get_run(state["parent_run_id"]).info.status == "KILLED"

    resumed = subprocess.run([*command, "--resume"], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    for key, step in stopped_at.items():
        assert f"{key}: resumed from step {step}" in resumed.stdout
        history = client.get_metric_history(state["runs"][key], "reward/mean")
        assert sorted(m.step for m in history) == list(range(1, 9))  # each step once: none lost, none twice
        assert client.get_run(state["runs"][key]).info.status == "FINISHED"


def test_validate_prints_how_the_seed_runs_share_the_machine_and_refuses_a_bad_setting(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    from run_control import polyrl_here

    config = _seeded(tiny_experiment, "plan", 2)
    path = write_experiment(tmp_path, config)
    done = polyrl_here(tmp_path, monkeypatch, "validate", str(path))
    assert done.returncode == 0, done.stderr
    if (os.cpu_count() or 1) >= 2:
        assert "seed runs side by side: 2 at a time" in done.stdout
    config["seeds_at_once"] = 0
    write_experiment(tmp_path, config)
    refused = polyrl_here(tmp_path, monkeypatch, "validate", str(path))
    assert refused.returncode == 2 and "seeds_at_once: got 0; allowed: auto" in refused.stderr


@pytest.mark.slow
def test_a_free_core_starts_the_next_round_early_and_a_run_started_ahead_of_the_last_decision_stays_out(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    import io

    from rich.console import Console

    from polyrl.launch.rounds import OUTSIDE_SEQUENCE_TAG

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARDS)
    config = tiny_experiment(name="pipelined", train={"steps": 3, "threads": 1})
    config.pop("seed")

    def reward(sleep: float) -> list[dict]:  # one reward for both arms; the slow arm's sleeps 2 s a step
        return [{"module": f"{tmp_path / 'rewards.py'}:Slow", "params": {"sleep": sleep}}]

    config["arms"] = {
        "fast": {"objective": {"name": "grpo"}, "rewards": reward(0.0)},
        "slow": {"objective": {"name": "dr_grpo"}, "rewards": reward(2.0)},
    }
    # A SESOI of 100 on a reward of a few units: "equivalent" at the first look (2 seeds). The
    # first sitting has no hours: it ends after round 1.
    config["until_resolved"] = {
        "comparisons": [{"arms": ["fast", "slow"], "metric": "reward/mean", "sesoi": 100.0}],
        "max_seeds": 3,
        "max_hours": 1e-6,
    }
    config["seeds_at_once"] = 2
    path = write_experiment(tmp_path, config)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    state_path = tmp_path / "runs" / "pipelined" / "experiment.json"

    def sitting(resume: bool) -> str:
        out = io.StringIO()
        run_experiment(path, resume=resume, show_progress=False, console=Console(file=out, width=200, color_system=None))
        return out.getvalue()

    printed = sitting(resume=False)
    assert "fast/seed_1: starts now, ahead of this round's decision" in printed  # fast/seed_0 ended before slow/seed_0
    state = json.loads(state_path.read_text())
    assert [r["seeds"] for r in state["sequential"]] == [1] and "fast/seed_1" not in state["finished"]
    ahead = client.get_run(state["runs"]["fast/seed_1"])
    assert ahead.info.status == "KILLED" and OUTSIDE_SEQUENCE_TAG in ahead.data.tags
    assert "fast/seed_1: stopped" in printed and "it is not part of it" in printed

    # More hours: round 2 trains fast/seed_1 on (now part of the sequence: the tag goes) and decides.
    config["until_resolved"].pop("max_hours")
    write_experiment(tmp_path, config)
    printed = sitting(resume=True)
    state = json.loads(state_path.read_text())
    assert [r["seeds"] for r in state["sequential"]] == [1, 2]
    decision = state["sequential"][-1]["decisions"]["fast-vs-slow:reward/mean"]
    assert decision["verdict"] == "equivalent" and decision["n"] == 2 and len(decision["differences"]) == 2
    assert sorted(state["finished"]) == ["fast/seed_0", "fast/seed_1", "slow/seed_0", "slow/seed_1"]
    resumed = client.get_run(state["runs"]["fast/seed_1"])
    assert resumed.info.status == "FINISHED" and OUTSIDE_SEQUENCE_TAG not in resumed.data.tags
    assert sorted(m.step for m in client.get_metric_history(resumed.info.run_id, "reward/mean")) == [1, 2, 3]
    # fast/seed_2 started ahead of round 2's decision, which ended the sequence: stopped, outside it.
    outside = client.get_run(state["runs"]["fast/seed_2"])
    assert outside.info.status == "KILLED" and OUTSIDE_SEQUENCE_TAG in outside.data.tags
    for arm in ("fast", "slow"):
        arm_run = client.get_run(state["arms"][arm])
        assert arm_run.info.status == "FINISHED" and arm_run.data.metrics["seeds/n"] == 2  # the finished seeds only


def test_a_stop_request_that_lands_mid_print_is_announced_at_the_next_safe_point():
    from polyrl.launch.interrupts import StopSignals

    lines: list[str] = []

    def echo(line: str) -> None:
        if not lines and not getattr(echo, "raised", False):
            echo.raised = True  # type: ignore[attr-defined]
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name=6>")  # what rich's console raised
        lines.append(line)

    stop = StopSignals(echo=echo)
    stop.armed = True
    stop._handle(signal.SIGTERM, None)  # before: the RuntimeError escaped the handler and ended the run (exit 1)
    assert stop.requested == signal.SIGTERM and lines == []
    stop.announce()
    assert lines == ["SIGTERM received: stopping after the current step with a checkpoint (send it again to stop at once)"]
    stop.announce()
    assert len(lines) == 1  # said once
