"""``validate`` and the start of ``run`` refuse the training prompts the sampler would.

Before: a data file whose prompt is 10,000 tokens, for a model of 512 positions, passed
``polyrl validate`` ("ok"); ``polyrl run`` created its MLflow runs and loaded the policy before
the sampler refused it. Now the pre-flight formats every row as the sampler does, with the
policy's tokenizer only, and refuses with the sampler's own message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import yaml
from transformers import AutoTokenizer
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.config.schema import load_experiment
from polyrl.data.errors import DataConfigError
from polyrl.data.prompt_lengths import model_positions
from polyrl.policies.text import build_char_tokenizer
from polyrl.trainer.build_data import build_sampler, training_rows

LONG = "1+1=? " * 2000  # the char tokenizer: one token per character, so 12,000 tokens


def write_experiment(tmp_path: Path, rows: list[dict], **overrides) -> Path:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "name": "probe",
        "data": {"source": "rows.jsonl"},
        "rollout": {"engine": "hf"},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def invoke(args: list, cwd: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def sampler_refusal(path: Path, tmp_path: Path, monkeypatch) -> str:
    """The message the run's sampler gives for the same config (trainer/build_data.py)."""
    monkeypatch.chdir(tmp_path)
    config = next(iter(load_experiment(path).values()))
    policy = Path(config.model.path)
    with pytest.raises(DataConfigError) as refused:
        build_sampler(config, training_rows(config), policy, AutoTokenizer.from_pretrained(str(policy)))
    return " ".join(str(refused.value).split())


def test_a_prompt_longer_than_the_model_positions_is_refused_by_validate_and_before_run_starts(
    tmp_path, monkeypatch, random_policy_dir
):
    # max_model_len 4096 > the model's 512 positions: the limit is the model's, read from its config.json.
    path = write_experiment(
        tmp_path,
        [{"prompt": "2+2=?", "answer": "4"}, {"prompt": LONG, "answer": "2"}],
        model={"path": str(random_policy_dir)},
        rollout={"max_model_len": 4096},
    )
    expected = sampler_refusal(path, tmp_path, monkeypatch)
    assert "row 1 has 12,000 tokens" in expected and "shorter than 512 tokens (the model's 512 positions" in expected
    for command in ("validate", "run"):
        code, output = invoke([command, path], tmp_path, monkeypatch)
        assert code == 2, output  # before: validate printed "ok" and exited 0
        assert "Traceback" not in output and output.count("error:") == 1, output
        assert f"- {expected}" in output, (expected, output)  # the sampler's own message, its field first
        assert "data.source 'rows.jsonl'" in output
    # run refused before any MLflow run (or store) or experiment folder was created.
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()
    # submit: the arms would run on a local Ray from this machine's files. Before, it started Ray
    # and created the MLflow runs, and each arm's sampler then refused the prompt. (Its log file
    # is opened before the command, as for every submit.)
    code, output = invoke(["submit", path], tmp_path, monkeypatch)
    assert code == 2 and f"- {expected}" in output, (expected, output)
    assert not (tmp_path / "mlflow.db").exists() and not ray.is_initialized()


def test_a_long_system_prompt_is_counted_as_the_chat_template_formats_it(tmp_path, monkeypatch, chat_model_dir):
    # Every row is short; the system prompt formatted into each one makes it too long.
    rows = [{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    path = write_experiment(tmp_path, rows, model={"path": str(chat_model_dir)}, data={"system_prompt": "Be brief. " * 400})
    expected = sampler_refusal(path, tmp_path, monkeypatch)
    code, output = invoke(["validate", path], tmp_path, monkeypatch)
    assert code == 2 and f"- {expected}" in output, (expected, output)
    assert "a prompt must be shorter than 512 tokens (rollout.max_model_len 512)" in output


def test_an_empty_user_turn_in_a_later_row_is_refused_by_validate(tmp_path, monkeypatch, chat_model_dir):
    # The source check reads row 0 only; the sampler reads them all, and so does the pre-flight now.
    rows = [{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}] * 3
    rows.append({"messages": [{"role": "user", "content": "  "}], "answer": "4"})
    path = write_experiment(tmp_path, rows, model={"path": str(chat_model_dir)})
    code, output = invoke(["validate", path], tmp_path, monkeypatch)
    assert code == 2, output
    assert "data.source: row 3: field 'messages'[0] is an empty user turn" in output, output


def test_the_builtin_policy_is_held_to_its_positions_with_its_tokenizer_only(tmp_path, monkeypatch, random_policy_dir):
    # The built-in tiny policy is not built by validate: its tokenizer is, and its positions are
    # the tokenizer's model_max_length, which must be what the tiny model's config.json declares.
    assert build_char_tokenizer().model_max_length == model_positions(random_policy_dir) == 512
    path = write_experiment(tmp_path, [{"prompt": LONG, "answer": "2"}], rollout={"max_model_len": 4096})
    code, output = invoke(["validate", path], tmp_path, monkeypatch)
    assert code == 2, output
    assert "row 0 has 12,000 tokens" in output and "shorter than 512 tokens (the model's 512 positions" in output, output


def test_prompts_that_fit_still_validate(tmp_path, monkeypatch, random_policy_dir):
    path = write_experiment(
        tmp_path,
        [{"prompt": "2+2=?", "answer": "4"}, {"prompt": "x" * 511, "answer": "2"}],
        model={"path": str(random_policy_dir)},
    )
    code, output = invoke(["validate", path], tmp_path, monkeypatch)
    assert code == 0 and "ok" in output, output


def test_a_gguf_policy_is_checked_with_its_converted_tokenizer_once_it_is_in_the_cache(tmp_path, random_policy_dir):
    import shutil

    from polyrl.config.schema import ModelConfig
    from polyrl.policies.cache import build_cached
    from polyrl.policies.pretrained import file_sha256, gguf_cache_key
    from polyrl.policies.tokenizer_only import policy_tokenizer

    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(60))  # only its content hash is read here
    model = ModelConfig(path=str(gguf_file), cache_dir=str(tmp_path / "cache"))
    # Not converted yet, and not a GGUF the reader can take: the model check reports it, by name.
    assert policy_tokenizer(model) is None
    final = tmp_path / "cache" / gguf_cache_key(gguf_file, file_sha256(gguf_file))
    build_cached(final, lambda folder: shutil.copytree(random_policy_dir, folder, dirs_exist_ok=True) and {})
    found = policy_tokenizer(model)
    assert found is not None and found.folder == final and model_positions(found.folder) == 512
    assert (
        found.tokenizer("1+1", add_special_tokens=False)["input_ids"]
        == build_char_tokenizer()("1+1", add_special_tokens=False)["input_ids"]
    )
