"""Bad inputs a user can give: each is one message, exit 2, no traceback, nothing left behind.

Commands run in-process through typer's CliRunner (as the console script runs them, with
the working folder set to the test's tmp_path); the training run goes through a subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.core.errors import PolyrlError

POLYRL = str(Path(sys.executable).with_name("polyrl"))

ROWS = [{"prompt": "2+2?", "completion": "4", "answer": "4"}, {"prompt": "3+3?", "completion": "7", "answer": "6"}]

# Each broken reward file, and the line its message must name.
BROKEN_REWARDS = {
    "syntax": ("from polyrl.rewards import RewardModule\nclass Broken(RewardModule)\n    pass\n", 2, "SyntaxError"),
    "import": (
        "from polyrl.rewards import RewardModule\nimport numpyy_not_installed\n",
        2,
        "ModuleNotFoundError: No module named 'numpyy_not_installed'",
    ),
    "init": (
        textwrap.dedent(
            """\
            from polyrl.rewards import RewardModule

            class Broken(RewardModule):
                def __init__(self, scale: float = 1.0):
                    self.scale = scale / 0

                def score(self, batch):
                    return [1.0] * len(batch)
            """
        ),
        5,
        "ZeroDivisionError",
    ),
}

ALWAYS_NONE = textwrap.dedent(
    """\
    from polyrl.rewards import RewardModule

    class NoScore(RewardModule):
        name = "no_score"

        def score(self, batch):
            return [None] * len(batch)
    """
)


def invoke(args: list[str], cwd: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    return result.exit_code, result.output


def assert_one_message(code: int, output: str, *fragments: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    assert output.count("error:") == 1, output
    for fragment in fragments:
        assert fragment in output, (fragment, output)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def experiment(tmp_path: Path, **overrides) -> dict:
    """An experiment whose MLflow store and checkpoints would go under tmp_path."""
    config = {
        "name": "probe",
        "rollout": {"engine": "hf"},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    config.update(overrides)
    return config


def write_yaml(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def assert_nothing_created(tmp_path: Path) -> None:
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists()


# --- a broken reward file ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BROKEN_REWARDS))
def test_broken_reward_file_is_one_message_from_validate_check_and_run(tmp_path, monkeypatch, kind):
    source, line, reason = BROKEN_REWARDS[kind]
    (tmp_path / "broken.py").write_text(source)
    ref = "broken.py:Broken"
    where = f"{tmp_path / 'broken.py'}, line {line}"
    config = write_yaml(tmp_path / "exp.yaml", experiment(tmp_path, rewards=[{"module": ref}]))
    rows = write_rows(tmp_path / "rows.jsonl", ROWS)
    for args in (["validate", config], ["run", config], ["rewards", "check", ref, "--data", rows]):
        code, output = invoke(args, tmp_path, monkeypatch)
        assert_one_message(code, output, ref, where, reason)
    # `run` stopped before any MLflow run, checkpoint folder or model load
    assert_nothing_created(tmp_path)


# --- a model folder without tokenizer or weights -----------------------------------------------


def test_model_folder_missing_tokenizer_or_weights_names_what_is_missing(tmp_path, monkeypatch, random_policy_dir):
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    shutil.copy(random_policy_dir / "config.json", only_config)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(random_policy_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors*"))
    cases = {only_config: ("no tokenizer", "no weights"), no_weights: ("no weights",)}
    for folder, missing in cases.items():
        config = write_yaml(tmp_path / "exp.yaml", experiment(tmp_path, model={"path": str(folder)}))
        for command in ("validate", "run"):
            code, output = invoke([command, config], tmp_path, monkeypatch)
            assert_one_message(code, output, "model.path", str(folder), *missing)
        assert ("no tokenizer" in output) == ("no tokenizer" in missing)
    assert_nothing_created(tmp_path)


def test_the_trainer_resolves_the_model_folder_with_the_same_check(tmp_path, random_policy_dir):
    from polyrl.config.schema import ConfigError, ModelConfig
    from polyrl.policies.paths import resolve_policy_path

    assert resolve_policy_path(ModelConfig(path=str(random_policy_dir))) == random_policy_dir
    (tmp_path / "config.json").write_text((random_policy_dir / "config.json").read_text())
    with pytest.raises(ConfigError, match="no tokenizer .*; no weights"):
        resolve_policy_path(ModelConfig(path=str(tmp_path)))


# --- validate checks what it can without training ----------------------------------------------


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"data": {"source": "missing.jsonl"}}, ["data.source", "missing.jsonl", "file not found"]),
        (
            {"data": {"source": "rows.jsonl", "prompt_field": "question"}},
            ["data.source", "prompt field 'question' (or messages field 'messages') not found in the first row", "'prompt'"],
        ),
        ({"data": {"source": "empty.jsonl"}}, ["data.source", "empty.jsonl is empty"]),
        ({"rewards": []}, ["rewards: the list is empty"]),
        (
            {"rewards": [{"module": "length", "params": {"scael": 3}}]},
            ["rewards[0]", "bad params {'scael': 3}", "accepted: unit, tokenizer_path, scale"],
        ),
        (
            {"tracking": {"accuracy_reward": "acc"}},
            ["tracking.accuracy_reward", "no reward is labelled 'acc'", "reward labels: accuracy"],
        ),
        ({"rewards": [{"module": "length", "weight": float("inf")}]}, ["rewards[0].weight", "finite number"]),
        # Image data for a text-only policy: found from the config and the first row, before any model loads.
        (
            {"data": {"source": "scenes"}},
            [
                "data.source 'scenes': its rows have image(s) (field 'images')",
                "model.builtin.task 'arithmetic' is a text-only policy",
                "vqa or caption",
            ],
        ),
        (
            {"data": {"source": "photos.jsonl", "images_field": "photo"}, "model": {"path": "text_model"}},
            ["data.source 'photos.jsonl': row 0 has image(s) (field 'photo')", "model.path 'text_model' is a text-only model"],
        ),
    ],
    ids=[
        "missing-data",
        "no-prompt-field",
        "empty-data",
        "no-rewards",
        "params-do-not-bind",
        "unknown-accuracy-reward",
        "infinite-weight",
        "builtin-text-policy-on-scenes",
        "text-model-on-image-rows",
    ],
)
def test_validate_checks_data_rewards_and_params_without_training(tmp_path, monkeypatch, overrides, fragments):
    write_rows(tmp_path / "rows.jsonl", ROWS)
    (tmp_path / "empty.jsonl").write_text("")
    write_rows(tmp_path / "photos.jsonl", [{"prompt": "<image>What color?", "answer": "red", "photo": ["red.png"]}])
    text_model = tmp_path / "text_model"  # a text-only model folder: config.json without vision_config, a tokenizer
    text_model.mkdir()
    (text_model / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    (text_model / "tokenizer.json").write_text("{}")
    config = write_yaml(tmp_path / "exp.yaml", experiment(tmp_path, **overrides))
    code, output = invoke(["validate", config], tmp_path, monkeypatch)
    assert_one_message(code, output, "exp.yaml: invalid experiment config", *fragments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_run_refuses_a_cuda_learner_on_a_machine_without_one_before_any_run_starts(tmp_path, monkeypatch):
    config = write_yaml(tmp_path / "exp.yaml", experiment(tmp_path, arms={"cpu": {}, "gpu": {"train": {"device": "cuda"}}}))
    code, output = invoke(["run", config], tmp_path, monkeypatch)
    assert_one_message(
        code,
        output,
        "exp.yaml: invalid experiment config",
        "train.device: 'cuda', but this torch sees no CUDA device",
        "allowed here: 'auto', 'cpu'",
        "(arm 'gpu')",
    )
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()  # nothing started
    # validate checks the file, not this machine: the arm may be meant for a GPU machine or a Ray cluster.
    code, output = invoke(["validate", config], tmp_path, monkeypatch)
    assert code == 0 and "ok" in output and "arm gpu" in output, output


def test_validate_names_the_arm_whose_data_lacks_the_prompt_field(tmp_path, monkeypatch):
    write_rows(tmp_path / "rows.jsonl", [{"question": "2+2?", "answer": "4"}])
    config = experiment(
        tmp_path, data={"source": "rows.jsonl"}, arms={"plain": {}, "fixed": {"data": {"prompt_field": "question"}}}
    )
    code, output = invoke(["validate", write_yaml(tmp_path / "exp.yaml", config)], tmp_path, monkeypatch)
    assert_one_message(code, output, "prompt field 'prompt' (or messages field 'messages') not found", "(arm 'plain')")
    assert "fixed" not in output


# --- rewards check --params ---------------------------------------------------------------------


@pytest.mark.parametrize("params", ["{target: 5}", "[5]"])
def test_rewards_check_malformed_params_names_the_option(tmp_path, monkeypatch, params):
    rows = write_rows(tmp_path / "rows.jsonl", ROWS)
    code, output = invoke(["rewards", "check", "length", "--data", rows, "--params", params], tmp_path, monkeypatch)
    assert_one_message(code, output, "--params", params)


# --- compare on a store that is not there -------------------------------------------------------


@pytest.mark.parametrize("store", ["nonexistent/dir/mlflow.db", "missing.db"])
def test_compare_with_a_mistyped_store_says_so_and_creates_nothing(tmp_path, monkeypatch, store):
    uri = f"sqlite:///{tmp_path / store}"
    code, output = invoke(["compare", "probe", "--tracking-uri", uri], tmp_path, monkeypatch)
    assert_one_message(code, output, str(tmp_path / store), "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder, no database, no reports/


# --- the catch-all is the base class ------------------------------------------------------------


class BrandNewError(PolyrlError):
    """A user error type no command lists by name."""


@pytest.mark.parametrize(
    "target, args",
    [
        ("polyrl.launch.runner.validate_file", ["validate", "exp.yaml"]),
        ("polyrl.evals.evaluate.evaluate_models", ["eval", "--model", "m", "--suite", "arithmetic", "--engine", "hf"]),
        ("polyrl.cli.rewards.load_reward_class", ["rewards", "check", "length", "--data", "rows.jsonl"]),
    ],
    ids=["polyrl", "polyrl-eval", "polyrl-rewards"],
)
def test_every_command_group_reports_any_polyrl_error(tmp_path, monkeypatch, target, args):
    write_rows(tmp_path / "rows.jsonl", ROWS)
    module, _, name = target.rpartition(".")

    def raise_new(*_args, **_kwargs):
        raise BrandNewError("a brand-new user error")

    monkeypatch.setattr(f"{module}.{name}", raise_new)
    code, output = invoke(args, tmp_path, monkeypatch)
    assert_one_message(code, output, "a brand-new user error")


def test_an_error_class_may_set_its_exit_code():
    import typer

    from polyrl.cli.errors import user_errors

    class Failed(PolyrlError):
        exit_code = 1

    with pytest.raises(typer.Exit) as info, user_errors():
        raise Failed("an arm failed")
    assert info.value.exit_code == 1


# --- a reward that scores nothing ---------------------------------------------------------------


def test_rewards_check_warns_about_a_module_that_scores_nothing(tmp_path, monkeypatch):
    (tmp_path / "none.py").write_text(ALWAYS_NONE)
    rows = write_rows(tmp_path / "rows.jsonl", ROWS)
    code, output = invoke(["rewards", "check", "none.py:NoScore", "--data", rows], tmp_path, monkeypatch)
    assert code == 0, output
    assert "WARNING scored: no_score: returned None for all 2 samples" in output
    assert "allow_unscored: true" in output and "all checks passed (1 warning)" in output


@pytest.mark.slow  # a polyrl run subprocess; the quick tier keeps the in-process check (test_rewards_check_warns_about_a_module_that_scores_nothing)
def test_a_run_whose_reward_scores_nothing_fails_naming_the_module(tmp_path, tiny_experiment, write_experiment):
    (tmp_path / "none.py").write_text(ALWAYS_NONE)
    config = tiny_experiment(rewards=[{"module": "none.py:NoScore"}])
    config["train"]["steps"] = 1
    path = write_experiment(tmp_path, config)
    result = subprocess.run(
        [POLYRL, "run", str(path), "--no-progress"], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1, result.stderr
    assert "reward module 'no_score' returned None for all 16 samples" in result.stderr
    assert "allow_unscored: true" in result.stderr


# --- nothing escapes its folder -----------------------------------------------------------------


def record_experiment(uri: str, name: str, artifacts: Path, metrics: dict[str, list[float]]) -> None:
    """A polyrl-shaped experiment (parent run + one arm run) in a real MLflow SQLite store."""
    from mlflow.tracking import MlflowClient

    from polyrl.tracking.mlflow_runs import ARM_TAG, EXPERIMENT_TAG, ROLE_TAG

    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(name, artifact_location=str(artifacts))
    parent = client.create_run(experiment_id, run_name="parent", tags={EXPERIMENT_TAG: name, ROLE_TAG: "experiment"})
    arm = client.create_run(
        experiment_id,
        run_name="main",
        tags={"mlflow.parentRunId": parent.info.run_id, EXPERIMENT_TAG: name, ARM_TAG: "main", ROLE_TAG: "arm"},
    )
    for key, values in metrics.items():
        for step, value in enumerate(values, 1):
            client.log_metric(arm.info.run_id, key, value, step=step)
    client.set_terminated(arm.info.run_id)  # a finished arm: compare reports an unfinished one as such (exit 1)


@pytest.mark.parametrize("kind", ["traversal", "absolute"])
def test_no_name_that_becomes_a_path_escapes_its_folder(tmp_path, monkeypatch, random_policy_dir, kind):
    """Experiment, arm, eval-suite and scaffold names are refused unless they are safe names.

    The report folder of ``polyrl compare`` is ``reports/<experiment>`` without ``--out``; an
    MLflow experiment name may legitimately hold '/' (``tracking.experiment``), so it is made
    folder-safe (a slug) rather than refused, and the report lands inside ``reports``.
    ``--out`` is an explicit path the user typed, so an absolute folder is allowed there (see
    the next test); what polyrl names inside it must stay inside.
    """
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    # Both kinds aim at tmp_path/escaped..., so an escape would show up below.
    unsafe = "../../escaped" if kind == "traversal" else str(tmp_path / "escaped")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    record_experiment(uri, unsafe, work / "artifacts", {"reward/mean": [0.1, 0.2]})
    refused = {
        "experiment name": ["validate", write_yaml(work / "exp.yaml", experiment(work, name=unsafe))],
        "arm name": ["validate", write_yaml(work / "arms.yaml", experiment(work, arms={unsafe: {}}))],
        "eval suite name": [
            "eval",
            "--model",
            random_policy_dir,
            "--engine",
            "hf",
            "--suite",
            write_yaml(work / "suite.yaml", {"name": unsafe, "datasets": [{"source": "arithmetic"}]}),
        ],
        "reward scaffold": ["rewards", "new", unsafe, "--dir", work / "scaffold"],
    }
    for what, args in refused.items():
        code, output = invoke(args, work, monkeypatch)
        assert code == 2, (what, output)
        assert "Traceback" not in output and output.count("error:") == 1, (what, output)
    assert not (work / "scaffold").exists()
    code, output = invoke(["compare", unsafe, "--tracking-uri", uri], work, monkeypatch)
    assert code == 0, output
    (report_dir,) = (work / "reports").iterdir()
    assert (report_dir / "report.md").is_file() and report_dir.name.endswith("escaped")
    outside = [p for p in tmp_path.rglob("*") if not p.is_relative_to(work) and p not in (tmp_path / "a",)]
    assert outside == [], outside


def test_compare_out_may_be_absolute_and_its_files_stay_inside(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record_experiment(uri, "probe", tmp_path / "artifacts", {"reward/mean": [0.1, 0.2], "eval/a..b/accuracy": [0.2, 0.4]})
    (tmp_path / "elsewhere").mkdir()
    out = (tmp_path / "elsewhere" / "report").resolve()
    code, output = invoke(["compare", "probe", "--tracking-uri", uri, "--out", out], tmp_path / "elsewhere", monkeypatch)
    assert code == 0, output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert written == ["eval_a..b_accuracy.png", "report.md", "reward_mean.png"], written
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["report"]
