"""Suite YAML: the shipped suites load; every error names its field path."""

from __future__ import annotations

import pytest

from polyrl.evals.suite import EvalError, load_suite, parse_suite

BASE = {"name": "s", "datasets": [{"source": "arithmetic", "split": "test"}]}


def test_eval_shipped_suites_load_by_name():
    suite, folder = load_suite("arithmetic")
    assert suite.name == "arithmetic" and folder.name == "evals"
    assert suite.generation.sampling_settings().temperature == 0.0  # greedy
    assert suite.accuracy_params() == {"extract": "hash"}
    passk, _ = load_suite("arithmetic_passk")
    assert passk.metrics.pass_at_k == [1, 2, 4] and passk.generation.n == 4


def test_eval_single_dataset_mapping_and_default_label():
    suite = parse_suite({"name": "s", "datasets": {"source": "data/caps.jsonl", "split": "val"}})
    assert [d.label for d in suite.datasets] == ["caps-val"]
    assert suite.accuracy_params() == {}  # text suites measure accuracy by default
    caption = parse_suite({**BASE, "kind": "caption"})
    assert caption.accuracy_params() is None and caption.coco_enabled()


@pytest.mark.parametrize(
    "change, path, words",
    [
        ({"generation": {"decoding": "greedy", "n": 4}}, "generation.n", "identical"),
        (
            {"generation": {"decoding": "sample", "n": 2}, "metrics": {"pass_at_k": [1, 4]}},
            "metrics.pass_at_k",
            "exceeds generation.n=2",
        ),
        ({"datasets": [{"sorce": "arithmetic"}]}, "datasets[0].sorce", "unknown field"),
        ({"datasets": [{"source": "arithmetic", "limit": 0}]}, "datasets[0].limit", "greater than or equal to 1"),
        ({"generation": {"temperature": -1}}, "generation.temperature", "greater than 0"),
        ({"metrics": {"rewards": [{"module": "rouge_l", "weight": "x"}]}}, "metrics.rewards[0].weight", "valid number"),
        ({"kind": "image"}, "kind", "'text' or 'caption'"),
        ({"datasets": [{"source": "arithmetic"}, {"source": "arithmetic"}]}, "datasets", "duplicate"),
        ({"metrics": {"accuracy": False, "pass_at_k": [1]}}, "metrics.pass_at_k", "needs metrics.accuracy"),
    ],
)
def test_eval_suite_errors_name_the_field_path(change, path, words):
    with pytest.raises(EvalError) as info:
        parse_suite({**BASE, **change}, "suite.yaml")
    message = str(info.value)
    assert message.startswith("suite.yaml: invalid eval suite")
    assert f"  - {path}" in message and words in message


def test_eval_unknown_suite_lists_known_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EvalError, match="known suites: .*arithmetic"):
        load_suite("nope")
    with pytest.raises(EvalError, match="no such file"):
        load_suite(str(tmp_path / "missing.yaml"))


def test_eval_suite_search_path_env(tmp_path, monkeypatch, suite_file):
    suite_file(tmp_path / "mine.yaml", {**BASE, "name": "mine"})
    monkeypatch.setenv("POLYRL_EVAL_SUITES", str(tmp_path))
    suite, folder = load_suite("mine")
    assert suite.name == "mine" and folder == tmp_path


def test_eval_suite_errors_use_the_experiment_formatter():
    # The shared formatter (polyrl.config.schema) lists the allowed fields of an unknown one
    # and the bad value; the suite's own copy did neither.
    with pytest.raises(EvalError) as info:
        parse_suite({**BASE, "datasets": [{"source": "arithmetic", "splt": "test"}], "generation": {"n": 3}}, "suite.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "suite.yaml: invalid eval suite"
    assert (
        "  - datasets[0].splt: unknown field; allowed: accuracy, answer_field, chat_template, holdout, image_field, limit, messages_field, name, prompt_field, references_field, source, split, system_prompt"
        in lines
    )
    assert "  - generation.n: greedy decoding gives 3 identical samples; use decoding: sample for n > 1 (got 3)" in lines


def test_eval_suite_file_with_a_repeated_key_is_refused(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text("name: s\ndatasets: [{source: arithmetic}]\ngeneration: {max_tokens: 8}\ngeneration: {max_tokens: 64}\n")
    with pytest.raises(EvalError, match=r"suite.yaml: duplicate key 'generation' at line 4 \(first at line 3\)"):
        load_suite(str(path))
