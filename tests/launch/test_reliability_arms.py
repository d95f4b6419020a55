"""Arms are independent: one that fails does not stop the others, and every report names it.

``polyrl run`` of a three-arm experiment whose middle arm's reward raises trains the third arm
too, then names the failed arm with its error and exits 1 (``--fail-fast`` keeps stopping at
the first failure). ``polyrl compare`` states each arm's status (finished, failed with its
error, stopped, running, not run), compares only runs that finished, and exits 1 when an arm
did not finish.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from run_control import polyrl_here
from typer.testing import CliRunner

from polyrl.analysis.compare import compare_experiment
from polyrl.cli.main import app
from polyrl.tracking.mlflow_runs import ARM_TAG, ERROR_TAG, EXPERIMENT_TAG, ROLE_TAG, SEED_TAG

BOOM = textwrap.dedent(
    """\
    from polyrl.rewards import RewardModule

    class Boom(RewardModule):
        name = "boom"

        def score(self, batch):
            raise RuntimeError("the scoring service is down")
    """
)


def _three_arms(tmp_path: Path, tiny_experiment, write_experiment) -> Path:
    (tmp_path / "boom.py").write_text(BOOM)
    config = tiny_experiment(name="three", train={"steps": 1}, rollout={"prompts_per_step": 2, "samples_per_prompt": 2})
    config["arms"] = {"a": {}, "b": {"rewards": [{"module": "boom.py:Boom"}]}, "c": {}}
    return write_experiment(tmp_path, config)


def _run(tmp_path: Path, monkeypatch, *args: str):
    """``polyrl run ARGS --no-progress`` in this process, from ``tmp_path``."""
    return polyrl_here(tmp_path, monkeypatch, "run", *args, "--no-progress")


def _arm_runs(client: MlflowClient, parent_run_id: str) -> dict[str, object]:
    experiment = client.get_experiment_by_name("three")
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`{ROLE_TAG}` = 'arm'"
    )
    return {run.data.tags[ARM_TAG]: run for run in runs}


def _compare(tmp_path: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["compare", "three", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(tmp_path / "report")]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.mark.slow
def test_a_failing_middle_arm_does_not_stop_the_next_and_compare_names_it(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    path = _three_arms(tmp_path, tiny_experiment, write_experiment)
    ran = _run(tmp_path, monkeypatch, str(path))
    # Before: the run ended at arm b with exit 2, and arm c was never started.
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "Traceback" not in ran.stdout + ran.stderr
    assert "1 of 3 arms failed" in ran.stderr and "'b' (MLflow run" in ran.stderr, ran.stderr
    assert "reward module 'boom' raised RuntimeError: the scoring service is down" in ran.stderr
    assert "polyrl run" in ran.stderr and "--resume" in ran.stderr  # how to retrain only the failed arm
    assert "a: reward" in ran.stdout and "c: reward" in ran.stdout  # the arms that finished are summarised
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.search_runs(
        [client.get_experiment_by_name("three").experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'experiment'"
    )[0]
    arms = _arm_runs(client, parent.info.run_id)
    assert {arm: run.info.status for arm, run in arms.items()} == {"a": "FINISHED", "b": "FAILED", "c": "FINISHED"}
    assert "the scoring service is down" in arms["b"].data.tags[ERROR_TAG]
    assert parent.info.status == "FAILED"

    code, output = _compare(tmp_path, monkeypatch)
    # Before: exit 0, arm b a row of dashes.
    assert code == 1, output
    assert "b: failed: reward module 'boom' raised RuntimeError: the scoring service is down" in output.replace("\n", " ")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "- **b**: failed" in report and "1 of 3 arms did not finish" in report
    assert "| b |" not in report and "| a |" in report and "| c |" in report  # no values from the failed arm

    # --fail-fast: the old behaviour, the first failure ends the run; compare says c never ran.
    fast = _run(tmp_path, monkeypatch, str(path), "--fail-fast")
    assert fast.returncode == 2, fast.stderr[-3000:]
    assert "the scoring service is down" in fast.stderr and "c: reward" not in fast.stdout
    code, output = _compare(tmp_path, monkeypatch)
    assert code == 1 and "c: not run" in output, output


def _store(tmp_path: Path) -> tuple[str, MlflowClient, str, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("states", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(
        experiment_id,
        run_name="parent",
        tags={EXPERIMENT_TAG: "states", ROLE_TAG: "experiment", "polyrl.arms": "done,broken,going,never"},
    )
    return uri, client, experiment_id, parent.info.run_id


def _arm(client, experiment_id, parent_run_id, arm, status, values, *, seed=None, error=None):
    tags = {
        "mlflow.parentRunId": parent_run_id,
        EXPERIMENT_TAG: "states",
        ARM_TAG: arm,
        ROLE_TAG: "arm" if seed is None else "seed",
        **({SEED_TAG: str(seed)} if seed is not None else {}),
        **({ERROR_TAG: error} if error else {}),
    }
    run = client.create_run(experiment_id, run_name=arm, tags=tags)
    for step, value in enumerate(values, 1):
        client.log_metric(run.info.run_id, "reward/mean", value, step=step)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


def test_compare_states_each_arm_and_compares_only_finished_runs(tmp_path):
    uri, client, experiment_id, parent = _store(tmp_path)
    _arm(client, experiment_id, parent, "done", "FINISHED", [0.1, 0.5])
    _arm(client, experiment_id, parent, "broken", "FAILED", [0.2], error="reward module 'x' raised KeyError: 'answer'")
    _arm(client, experiment_id, parent, "going", "RUNNING", [0.9])
    comparison = compare_experiment("states", tracking_uri=uri, out_dir=tmp_path / "report", log_to_mlflow=False)
    said = {status.arm: status.describe() for status in comparison.statuses}
    assert said == {
        "done": "finished",
        "broken": "failed: reward module 'x' raised KeyError: 'answer'",
        "going": "running",
        "never": "not run",
    }
    assert list(comparison.histories) == ["done"]  # no value from a run that did not finish
    assert "3 of 4 arms did not finish" in comparison.unfinished and "never (not run)" in comparison.unfinished
    assert "| going |" not in comparison.table_markdown and "| done | 0.5 |" in comparison.table_markdown


def test_seeded_compare_uses_only_finished_seeds_and_names_the_failed_one(tmp_path):
    uri, client, experiment_id, parent = _store(tmp_path)
    client.set_tag(parent, "polyrl.arms", "x,y")
    for arm, failing in (("x", None), ("y", 1)):
        arm_run = _arm(client, experiment_id, parent, arm, "FAILED" if failing is not None else "FINISHED", [])
        for seed in (0, 1, 2):
            failed = seed == failing
            _arm(
                client,
                experiment_id,
                arm_run,
                arm,
                "FAILED" if failed else "FINISHED",
                [1.0 + seed] if not failed else [50.0],
                seed=seed,
                error="boom" if failed else None,
            )
    comparison = compare_experiment("states", tracking_uri=uri, out_dir=tmp_path / "report", log_to_mlflow=False)
    said = {status.arm: status.describe() for status in comparison.statuses}
    assert said == {"x": "finished (3 of 3 seeds finished)", "y": "failed (2 of 3 seeds finished): seed 1 failed (boom)"}
    # Seed 1's 50.0 enters no mean or interval: y's mean over seeds 0 and 2 at step 1 is (1.0 + 3.0) / 2 = 2.0.
    assert comparison.histories["y"]["reward/mean"] == [(1, 2.0)]
