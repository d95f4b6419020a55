"""``polyrl plan``: seeds and wall time from --sd, or from a pilot experiment's per-seed
differences read from a real MLflow store; mistakes are one message naming the option."""

from __future__ import annotations

from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.tracking.mlflow_runs import ExperimentTracker

METRIC = "eval/arith/accuracy"


def _invoke(*args):
    return CliRunner().invoke(app, ["plan", *args])


def test_plan_from_an_sd_prints_both_designs_and_the_wall_time():
    result = _invoke("--sd", "1", "--effect", "1", "--minutes-per-run", "30")
    assert result.exit_code == 0, result.output
    # effect/sd 1: the fixed paired t design needs 10 seeds (see test_planning); the sequential
    # budget 12. Wall time of the fixed design: 10 seeds × 2 arms × 30 min = 600 min = 10.0 h.
    assert "fixed design: 10 seeds per arm" in result.output
    assert "budget max_seeds 12" in result.output
    assert "fixed design 10.0 h" in result.output and "at most 12.0 h" in result.output  # 12 × 2 × 30 min
    assert "alpha 0.05 over 1 comparison (Bonferroni)" in result.output


def test_three_arms_split_alpha_over_every_pair():
    result = _invoke("--sd", "1", "--effect", "1", "--arms", "3")
    assert result.exit_code == 0, result.output
    assert "over 3 comparisons" in result.output and "(--minutes-per-run gives the wall time)" in result.output


def test_mistakes_are_one_message_naming_the_option():
    neither = _invoke("--effect", "1")
    assert neither.exit_code == 2 and "give --sd, or an EXPERIMENT" in neither.output
    spending = _invoke("--sd", "1", "--effect", "1", "--spending", "linear")
    assert spending.exit_code == 2 and "--spending = 'linear': must be one of obrien_fleming, pocock" in spending.output
    assert "Traceback" not in spending.output
    stray = _invoke("--sd", "1", "--effect", "1", "--metric", METRIC)
    assert stray.exit_code == 2 and "read a pilot experiment" in stray.output


def _pilot(uri: str, finals: dict[str, dict[int, float]]) -> None:
    tracker = ExperimentTracker(uri, "pilot")
    parent = tracker.start_parent("pilot")
    for arm, by_seed in finals.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, final in by_seed.items():
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": 2})
            for step in (1, 2):
                run.log_step(step, {METRIC: final if step == 2 else 0.0, "perf/step_s": 0.1})
            run.finish()
        arm_run.finish()
    parent.finish()


def test_plan_from_a_pilot_experiment(mlflow_uri):
    # grpo − dr_grpo per seed: 0.55 − 0.5 = 0.05, 0.6 − 0.5 = 0.1, 0.7 − 0.7 = 0: mean 0.05, sd 0.05.
    _pilot(mlflow_uri, {"grpo": {0: 0.55, 1: 0.6, 2: 0.7}, "dr_grpo": {0: 0.5, 1: 0.5, 2: 0.7}})
    result = _invoke("pilot", "--metric", METRIC, "--effect", "0.05", "--minutes-per-run", "20", "--tracking-uri", mlflow_uri)
    assert result.exit_code == 0, result.output
    assert f"pilot: pilot, {METRIC}, grpo − dr_grpo at seeds 0, 1, 2: 0.05, 0.1, 0; sd 0.05" in result.output
    # effect/sd 1 as in the --sd test: the same 10 seeds for the fixed design.
    assert "fixed design: 10 seeds per arm" in result.output
    # 3 seeds measure the sd loosely; the 80% upper bound is 0.05 · √(2 / χ²_2(0.2)) = 0.05 · √(2 / 0.4463) = 0.1058.
    assert "its 80% upper bound is 0.1058" in result.output
    unknown = _invoke(
        "pilot", "--metric", METRIC, "--effect", "0.05", "--arm-a", "ppo", "--arm-b", "grpo", "--tracking-uri", mlflow_uri
    )
    assert unknown.exit_code == 2 and "--arm-a 'ppo' is not an arm of experiment 'pilot'; its arms: " in unknown.output
    missing = _invoke("pilot", "--metric", "eval/none", "--effect", "0.05", "--tracking-uri", mlflow_uri)
    assert missing.exit_code == 2 and "'eval/none': 0 finished seed(s)" in missing.output and METRIC in missing.output


def test_plan_is_a_command_with_help():
    result = _invoke("--help")
    assert result.exit_code == 0 and "--effect" in result.output and "--minutes-per-run" in result.output
