"""``polyrl validate`` refuses the ``env:`` settings the episode runner would refuse when the run
starts, from the policy's tokenizer files (no weights load). Before, each of these passed
``validate`` and failed ``run`` after its MLflow run existed."""

from __future__ import annotations

import shutil

import pytest

from polyrl.config.schema import ConfigError
from polyrl.launch.preflight import preflight_file
from tests.envs.scripted import HERMES_TOOLS_TEMPLATE


def experiment(tmp_path, write_experiment, model: dict | None, **env) -> object:
    config = {"name": "e", "data": {"source": "calculator"}, "env": {"module": "calculator", "max_turns": 2, **env}}
    if model is not None:
        config["model"] = model
    return write_experiment(tmp_path, config)


@pytest.fixture
def hermes_model(tmp_path, tiny_arch_dir):
    """The tiny ChatML model, its template rendering tools= and asking for <tool_call> tags."""
    from transformers import AutoTokenizer

    folder = tmp_path / "hermes_model"
    shutil.copytree(tiny_arch_dir("qwen2"), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = HERMES_TOOLS_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def refusal(path) -> str:
    with pytest.raises(ConfigError) as caught:
        preflight_file(path)
    return " ".join(str(caught.value).split())


def test_env_with_a_policy_without_a_chat_template(tmp_path, write_experiment):
    # The built-in tiny policy's tokenizer has no chat template.
    message = refusal(experiment(tmp_path, write_experiment, None))
    assert "env: episodes are rendered through the policy's chat template, but the tokenizer of the built-in policy" in message


def test_tool_format_template_with_a_template_without_tools(tmp_path, write_experiment, tiny_arch_dir):
    path = experiment(tmp_path, write_experiment, {"path": str(tiny_arch_dir("qwen2"))}, tool_format="template")
    assert "env.tool_format: template, but the policy's chat template does not render tools=" in refusal(path)


def test_a_tool_parser_the_template_does_not_ask_for(tmp_path, write_experiment, hermes_model):
    path = experiment(tmp_path, write_experiment, {"path": str(hermes_model)}, tool_parser="llama3_json")
    assert "env.tool_parser: llama3_json, but the policy's chat template asks for calls in <tool_call> tags" in refusal(path)
    # What the template asks for, and auto, pass.
    for parser in ("hermes", "auto"):
        preflight_file(
            experiment(tmp_path, write_experiment, {"path": str(hermes_model)}, tool_parser=parser, tool_format="template")
        )
