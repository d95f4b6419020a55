"""Fixtures of the eval-harness tests: tiny random models, an HF engine, a scripted engine.

Random 0.3M-parameter Qwen2 models build in about a second and generate fast; tests that need
known accuracies build their datasets from the model's own outputs, or use ``ScriptedEngine``
(a rollout engine that returns given texts) where the exact numbers are computed by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

from polyrl.core.types import Completion, PromptSample, SamplingSettings  # noqa: E402


class ScriptedEngine:
    """A rollout engine that answers each prompt with given texts (one list of n per prompt).

    A text ending in ``…`` is reported as truncated (finish reason ``length``); a completion's
    token ids are its characters, so its length is ``len(text)``.
    """

    name = "scripted"

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.calls: list[SamplingSettings] = []

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        self.calls.append(settings)
        groups = []
        for prompt in prompts:
            texts = self.answers[prompt.prompt][: settings.n]
            groups.append(
                [
                    Completion(
                        prompt_ids=[0],
                        completion_ids=[ord(ch) for ch in text.rstrip("…")],
                        text=text.rstrip("…"),
                        sampling_logprobs=[0.0] * len(text.rstrip("…")),
                        finish_reason="length" if text.endswith("…") else "stop",
                    )
                    for text in texts
                ]
            )
        return groups

    def close(self) -> None:
        pass


@pytest.fixture
def scripted_engine():
    return ScriptedEngine


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from polyrl.policies.text import build_random_text_model_dir

    return build_random_text_model_dir(tmp_path_factory.mktemp("eval_models") / "tiny-a", "0.3m", seed=0)


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory) -> Path:
    from polyrl.policies.text import build_random_text_model_dir

    return build_random_text_model_dir(tmp_path_factory.mktemp("eval_models_b") / "tiny-b", "0.3m", seed=1)


@pytest.fixture(scope="session")
def hf_engine(tiny_model):
    from polyrl.engines.base import build_rollout_engine

    engine = build_rollout_engine("hf", str(tiny_model), seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def eval_tracking_store(tmp_path_factory) -> str:
    # One SQLite store for the session: creating a store runs MLflow's migrations (seconds).
    return f"sqlite:///{tmp_path_factory.mktemp('eval_mlflow') / 'mlflow.db'}"


@pytest.fixture
def eval_tracking(eval_tracking_store, monkeypatch) -> str:
    """The session's MLflow store, exported as MLFLOW_TRACKING_URI; tests use their own experiments."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", eval_tracking_store)
    return eval_tracking_store


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def jsonl():
    return write_jsonl


def write_suite(path: Path, suite: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


@pytest.fixture
def suite_file():
    return write_suite
