"""The learner's default thread count honours OMP_NUM_THREADS (after vLLM has dropped torch to one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from polyrl.config.schema import ExperimentConfig
from polyrl.runtime.threads import default_torch_threads, set_torch_threads
from polyrl.trainer.build_rollout import build_rollout


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    set_torch_threads(before)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3),
        (" 1 ", 1),  # what a shell export with stray spaces leaves
        ("0", None),  # not a thread count: every core
        ("two", None),
        ("", None),
    ],
)
def test_default_threads_read_omp_num_threads(monkeypatch, value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_torch_threads() == (expected or os.cpu_count())


def test_default_threads_are_every_core_without_omp_num_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_torch_threads() == os.cpu_count()


def test_the_learner_keeps_omp_num_threads_once_the_engine_is_up(monkeypatch, restore_threads):
    # One more than the machine has, so that "every core" (what the rollout side chose before,
    # whatever the environment said) cannot pass for it.
    asked = (os.cpu_count() or 1) + 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(asked))
    set_torch_threads(1)  # what vLLM leaves behind "for serving"
    cfg = ExperimentConfig.model_validate({"name": "threads"})
    side = build_rollout(cfg, Path("unused"), tokenizer=None, samples=[], takes_images=False, engine=object())
    assert side.torch_threads == asked == torch.get_num_threads()

    cfg = ExperimentConfig.model_validate({"name": "threads", "train": {"threads": 1}})
    side = build_rollout(cfg, Path("unused"), tokenizer=None, samples=[], takes_images=False, engine=object())
    assert side.torch_threads == 1 == torch.get_num_threads()  # train.threads wins over the environment
