"""``validate`` refuses what ``run`` would: settings that passed ``validate`` and were
refused by ``run`` only after its MLflow runs existed and its policy had loaded. Each is now one
message naming the field path, from ``validate`` and from the start of ``run``, before anything
is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from polyrl.cli.main import app


def experiment(tmp_path: Path, **overrides) -> dict:
    config = {
        "name": "probe",
        "rollout": {"engine": "hf"},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    config.update(overrides)
    return config


def invoke(args: list[str], cwd: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    return result.exit_code, result.output


CHAT_ROWS = [{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}]


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (
            {"data": {"chat_template": True}},
            [
                "data.chat_template: true, but the tokenizer of the built-in policy (model.builtin.task 'arithmetic') has no chat template"
            ],
        ),
        (
            {"data": {"source": "arithmetic_chat"}},
            [
                "data.messages_field: the rows of data.source 'arithmetic_chat' carry a 'messages' column",
                "model.builtin.task 'arithmetic') has none",
            ],
        ),
        (
            {"data": {"source": "chat.jsonl"}},
            ["data.messages_field: the rows of data.source 'chat.jsonl' carry a 'messages' column"],
        ),
        (
            {"data": {"system_prompt": "Be brief."}},
            [
                "data.system_prompt: set, but prompts are not formatted through a chat template (data.chat_template is unset, the rows have no 'messages' column)"
            ],
        ),
        (
            {"model": {"builtin": {"task": "vqa"}}, "data": {"source": "scenes"}, "train": {"padding_free": True}},
            [
                "train.padding_free: true, but model.builtin.task 'vqa' is an image-text policy",
                "allowed here: padding_free: false or auto",
            ],
        ),
    ],
    ids=[
        "chat-template-true-builtin",
        "builtin-chat-rows-builtin-policy",
        "file-chat-rows-builtin-policy",
        "system-prompt-no-chat",
        "padding-free-image-policy",
    ],
)
def test_validate_and_run_refuse_before_anything_starts(tmp_path, monkeypatch, overrides, fragments):
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS))
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment(tmp_path, **overrides), sort_keys=False))
    for command in ("validate", "run"):
        code, output = invoke([command, path], tmp_path, monkeypatch)
        assert code == 2, output  # before: validate exited 0 ("ok"); run refused after MLflow runs and the model load
        assert "Traceback" not in output and output.count("error:") == 1, output
        for fragment in fragments:
            assert fragment in output, (fragment, output)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_chat_rows_with_a_templated_model_and_padding_free_auto_still_validate(tmp_path, monkeypatch, chat_model_dir):
    config = experiment(
        tmp_path,
        model={"path": str(chat_model_dir)},
        data={"source": "arithmetic_chat", "system_prompt": "Be brief."},
        train={"padding_free": "auto"},
    )
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    code, output = invoke(["validate", path], tmp_path, monkeypatch)
    assert code == 0 and "ok" in output, output
