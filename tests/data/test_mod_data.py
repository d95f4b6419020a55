"""Prompt dataset loading through HF datasets, and the resumable PromptSampler."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from polyrl.core.types import PromptSample  # noqa: E402
from polyrl.data.prompt_samples import rows_to_prompt_samples  # noqa: E402
from polyrl.data.prompts import DataConfigError, check_prompt_source, load_prompt_dataset  # noqa: E402
from polyrl.data.sampler import PromptSampler  # noqa: E402
from polyrl.tasks.arithmetic import SHIPPED_SIZES  # noqa: E402


def test_load_shipped_arithmetic():
    train = load_prompt_dataset("arithmetic", "train")
    test = load_prompt_dataset("arithmetic", "test", limit=10)
    assert len(train) == SHIPPED_SIZES["train"]
    assert len(test) == 10
    assert {"prompt", "answer", "references", "solution", "id", "split"} <= set(train.column_names)
    samples = rows_to_prompt_samples(test)
    assert all(isinstance(sample, PromptSample) for sample in samples)
    first = samples[0]
    assert first.prompt.startswith("Q: ") and first.prompt.endswith("A:")
    assert first.references == [first.fields["answer"]]
    assert set(first.fields) == {"answer", "solution", "id", "split"}
    assert first.images == []


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


USER_ROWS = [
    {"question": "What is 2+2?", "gold": "4", "topic": "math"},
    {"question": "Capital of France?", "gold": "Paris", "topic": "geo"},
    {"question": "1+1?", "gold": "2", "topic": "math"},
]


def test_user_jsonl_with_custom_fields(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", USER_ROWS)
    dataset = load_prompt_dataset(str(path), "train", prompt_field="question", answer_field="gold")
    samples = rows_to_prompt_samples(dataset, prompt_field="question", answer_field="gold")
    assert [s.prompt for s in samples] == [r["question"] for r in USER_ROWS]
    assert [s.references for s in samples] == [["4"], ["Paris"], ["2"]]
    assert samples[1].fields == {"gold": "Paris", "topic": "geo"}


def test_user_parquet_file_and_directory(tmp_path):
    dataset = datasets.Dataset.from_list([{"prompt": "a", "references": ["x", "y"]}, {"prompt": "b", "references": ["z"]}])
    dataset.to_parquet(str(tmp_path / "test.parquet"))
    from_file = load_prompt_dataset(str(tmp_path / "test.parquet"), "test")  # the file's name declares its split
    from_dir = load_prompt_dataset(str(tmp_path), "test")
    assert from_file["prompt"] == from_dir["prompt"] == ["a", "b"]
    assert [s.references for s in rows_to_prompt_samples(from_dir)] == [["x", "y"], ["z"]]
    _write_jsonl(tmp_path / "train.jsonl", USER_ROWS)
    assert len(load_prompt_dataset(str(tmp_path), "train", prompt_field="question")) == 3


def test_missing_file(tmp_path):
    with pytest.raises(DataConfigError, match="nope.jsonl"):
        load_prompt_dataset(str(tmp_path / "nope.jsonl"), "train")


def test_directory_without_split(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", USER_ROWS)
    with pytest.raises(DataConfigError, match="validation"):
        load_prompt_dataset(str(tmp_path), "validation")


@pytest.mark.parametrize("name, text", [("rows.jsonl", ""), ("rows.jsonl", "\n  \n"), ("rows.json", "")])
def test_empty_file_says_it_is_empty(tmp_path, name, text):
    # The file name holds no "empty": the message itself must say it (datasets' own is blank).
    (tmp_path / name).write_text(text)
    for check in (load_prompt_dataset, check_prompt_source):
        with pytest.raises(DataConfigError, match=rf"{name} is empty \(no rows\)$"):
            check(str(tmp_path / name), "train")


def test_check_prompt_source_reads_only_the_first_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    # Row 2 is not JSON: a full load would fail, the cheap check stops at row 1.
    path.write_text(json.dumps({"question": "2+2?"}) + "\n{not json\n")
    check_prompt_source(str(path), "train", prompt_field="question")
    with pytest.raises(DataConfigError, match=r"prompt field 'prompt' not found in the first row .*fields are \['question'\]"):
        check_prompt_source(str(path), "train")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataConfigError, match=r"bad.jsonl, line 1: not valid JSON"):
        check_prompt_source(str(tmp_path / "bad.jsonl"), "train")
    (tmp_path / "array.json").write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}], indent=2))
    check_prompt_source(str(tmp_path / "array.json"), "train")
    with pytest.raises(DataConfigError, match="file not found"):
        check_prompt_source(str(tmp_path / "nope.jsonl"), "train")
    check_prompt_source("arithmetic", "train")
    check_prompt_source("some-org/some-dataset", "train")  # a dataset name: left to the loader


def test_check_prompt_source_parquet_schema(tmp_path):
    datasets.Dataset.from_list([{"prompt": "a"}]).to_parquet(str(tmp_path / "rows.parquet"))
    check_prompt_source(str(tmp_path / "rows.parquet"), "train")
    with pytest.raises(DataConfigError, match="prompt field 'text' not found"):
        check_prompt_source(str(tmp_path / "rows.parquet"), "train", prompt_field="text")


def test_missing_prompt_field(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", USER_ROWS)
    with pytest.raises(DataConfigError, match="'prompt'") as error:
        load_prompt_dataset(str(path), "train")
    assert "question" in str(error.value)  # lists the columns that do exist


def test_unknown_builtin_split():
    with pytest.raises(DataConfigError, match="validation"):
        load_prompt_dataset("arithmetic", "validation")


def test_nonexistent_dataset_name_is_attempted_offline(monkeypatch, tmp_path):
    # Offline mode is read at import time, so flip the already-imported flags too: the test
    # must not wait on network timeouts.
    import huggingface_hub.constants

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf", raising=False)
    with pytest.raises(DataConfigError, match="polyrl-no-such-org/no-such-dataset") as error:
        load_prompt_dataset("polyrl-no-such-org/no-such-dataset", "train")
    assert "datasets.load_dataset" in str(error.value)


def _samples(n):
    return [PromptSample(prompt=f"p{i}", references=[str(i)]) for i in range(n)]


def test_sampler_covers_each_epoch_once_in_seeded_order():
    sampler = PromptSampler(_samples(10), seed=3)
    first = [s.prompt for s in sampler.next_batch(10)]
    second = [s.prompt for s in sampler.next_batch(10)]
    assert sorted(first) == sorted(second) == sorted(f"p{i}" for i in range(10))
    assert first != second  # a new shuffle every epoch
    assert sampler.state_dict()["epoch"] == 2
    again = PromptSampler(_samples(10), seed=3)
    assert [s.prompt for s in again.next_batch(10)] == first
    assert [s.prompt for s in PromptSampler(_samples(10), seed=4).next_batch(10)] != first
    assert [s.prompt for s in PromptSampler(_samples(10), shuffle=False).next_batch(4)] == ["p0", "p1", "p2", "p3"]


def test_sampler_resume_continues_identical_sequence():
    uninterrupted = PromptSampler(_samples(7), seed=11)
    reference = [[s.prompt for s in uninterrupted.next_batch(3)] for _ in range(8)]

    first = PromptSampler(_samples(7), seed=11)
    seen = [[s.prompt for s in first.next_batch(3)] for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))  # serialisable
    assert state == {"epoch": 1, "index": 2, "seed": 11, "num_samples": 7}
    resumed = PromptSampler(_samples(7), seed=11)
    resumed.load_state_dict(state)
    seen += [[s.prompt for s in resumed.next_batch(3)] for _ in range(5)]
    assert seen == reference


def test_sampler_from_dataset_and_bad_state():
    sampler = PromptSampler(load_prompt_dataset("arithmetic", "test", limit=20), seed=0)
    assert len(sampler) == 20 and len(sampler.next_batch(25)) == 25
    other = PromptSampler(_samples(5))
    with pytest.raises(ValueError, match="20"):
        other.load_state_dict(sampler.state_dict())
    with pytest.raises(DataConfigError):
        PromptSampler([])
