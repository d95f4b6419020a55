"""Split handling: a source gives the split asked for or is refused; a declared hold-out fraction
splits a file by a fixed hash; eval rows that are training rows are counted and warned about."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from polyrl.config.schema import ExperimentConfig
from polyrl.core.types import PromptSample
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import DataConfigError, check_prompt_source, load_prompt_dataset
from polyrl.data.splits import declared_split, overlap_count
from polyrl.evals.harness import SuiteRunner
from polyrl.evals.periodic import PeriodicEvaluator
from polyrl.monitoring.health import HealthMonitor
from polyrl.trainer.hooks import HealthHook

ROWS = [{"prompt": f"Q: {i}+1=? A:", "answer": str(i + 1)} for i in range(40)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_single_file_is_the_train_split_and_refuses_a_test_split(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", ROWS)
    assert len(load_prompt_dataset(str(rows), "train")) == 40
    # Before: any split of a single file loaded the whole file, so a "test" eval ran on training rows.
    for call in (lambda: load_prompt_dataset(str(rows), "test"), lambda: check_prompt_source(str(rows), "test")):
        with pytest.raises(
            DataConfigError, match=r"rows.jsonl is one file, which is the 'train' split only, so it has no split 'test'"
        ):
            call()


def test_a_file_named_after_its_split_gives_that_split_only(tmp_path):
    held = _jsonl(tmp_path / "rows.test.jsonl", ROWS[:5])
    assert load_prompt_dataset(str(held), "test")["prompt"] == [r["prompt"] for r in ROWS[:5]]
    with pytest.raises(DataConfigError, match=r"is named as the 'test' split, so it has no split 'train'"):
        load_prompt_dataset(str(held), "train")
    assert [declared_split(tmp_path / name) for name in ("test.jsonl", "a_validation.parquet", "a-dev.json", "latest.jsonl")] == [
        "test",
        "validation",
        "dev",
        None,
    ]


def test_a_hold_out_fraction_splits_a_file_by_a_fixed_hash_of_each_row(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", ROWS + ROWS[:3])  # three duplicates: they must share their original's split
    train = list(load_prompt_dataset(str(rows), "train", holdout=0.25)["prompt"])
    test = list(load_prompt_dataset(str(rows), "test", holdout=0.25)["prompt"])
    assert not set(train) & set(test) and sorted(train + test) == sorted(r["prompt"] for r in ROWS + ROWS[:3])
    assert 3 <= len(set(test)) <= 20  # about a quarter of 40 distinct prompts (fixed: the same rows every time)
    assert list(load_prompt_dataset(str(rows), "test", holdout=0.25)["prompt"]) == test
    with pytest.raises(
        DataConfigError, match=r"with a hold-out fraction a file has the splits \['train', 'test'\], not 'validation'"
    ):
        load_prompt_dataset(str(rows), "validation", holdout=0.25)
    with pytest.raises(
        DataConfigError, match="holdout splits a single local file by a fixed hash; this source is a built-in task"
    ):
        load_prompt_dataset("arithmetic", "test", holdout=0.25)
    (tmp_path / "folder").mkdir()
    _jsonl(tmp_path / "folder" / "test.jsonl", ROWS)
    with pytest.raises(DataConfigError, match="this source is a folder of split files"):
        load_prompt_dataset(str(tmp_path / "folder"), "test", holdout=0.25)


def test_data_test_split_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match=r"data.test_split is not read by anything"):
        ExperimentConfig(name="x", data={"source": "arithmetic", "test_split": "test"})
    assert ExperimentConfig(name="x", data={"source": "rows.jsonl", "holdout": 0.1}).data.holdout == 0.1


def _suite(tmp_path, dataset: dict) -> str:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "datasets": [{"name": "d", **dataset}], "generation": {"max_tokens": 4}}))
    return str(path)


def test_an_eval_dataset_takes_a_file_whole_unless_it_names_a_split_the_file_cannot_honour(tmp_path):
    _jsonl(tmp_path / "rows.jsonl", ROWS)
    assert len(SuiteRunner(_suite(tmp_path, {"source": "rows.jsonl"})).datasets[0].samples) == 40
    with pytest.raises(DataConfigError, match="no split 'test'"):
        SuiteRunner(_suite(tmp_path, {"source": "rows.jsonl", "split": "test"}))
    held = SuiteRunner(_suite(tmp_path, {"source": "rows.jsonl", "split": "test", "holdout": 0.25})).datasets[0].samples
    train = rows_to_prompt_samples(load_prompt_dataset(str(tmp_path / "rows.jsonl"), "train", holdout=0.25))
    assert held and overlap_count(held, train) == 0


def test_eval_rows_that_are_training_rows_are_counted_and_said_when_training_starts(tmp_path):
    _jsonl(tmp_path / "rows.jsonl", ROWS)
    evaluator = PeriodicEvaluator(SuiteRunner(_suite(tmp_path, {"source": "rows.jsonl", "limit": 10})))
    training = rows_to_prompt_samples(load_prompt_dataset(str(tmp_path / "rows.jsonl"), "train"))[5:]
    warnings = evaluator.overlap_warnings(training)
    # The eval set is rows 0-9; training holds rows 5-39: 5 shared.
    assert len(warnings) == 1 and warnings[0].startswith(
        "eval_overlap: 5 of the 10 rows of eval dataset 'd' are also training rows"
    )
    printed: list[str] = []
    hook = HealthHook(HealthMonitor(ExperimentConfig(name="x").health), arm="a", printer=printed.append, notes=warnings)
    hook.start(0)
    assert printed == [f"[a] warning: {warnings[0]}"]
    # Same text, other picture: not the same row.
    from PIL import Image

    red, blue = Image.new("RGB", (2, 2), (255, 0, 0)), Image.new("RGB", (2, 2), (0, 0, 255))
    assert overlap_count([PromptSample("<image>Q", images=[red])], [PromptSample("<image>Q", images=[blue])]) == 0
    assert overlap_count([PromptSample("<image>Q", images=[red])], [PromptSample("<image>Q", images=[red.copy()])]) == 1
