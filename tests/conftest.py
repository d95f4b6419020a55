"""Shared fixtures: tiny local models, isolated MLflow stores and experiment files.

Nothing here downloads anything: models are built from transformers configs with the
platform's own tokenizer, and every MLflow store is a SQLite file under pytest's tmp_path.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import yaml

from tests.engine_settings import kv_cache_for

# In-process vLLM engine core (no spawned process) and no hub look-ups.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

# Torch threads per pytest worker: the cores shared out among the workers (make test runs three
# on two cores), set before torch is imported. With torch's default (every core) in each worker,
# three processes ran six OpenMP threads on two cores. Runs inside a test, and the subprocesses a
# test starts, inherit it (polyrl's learner default honours OMP_NUM_THREADS); tests about threads
# set their counts explicitly. An OMP_NUM_THREADS of the caller's own is kept.
_PYTEST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _PYTEST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _PYTEST_WORKERS)))

_TMP_PATHS_HANDED_OUT = itertools.count()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's ``tmp_path``, one level down, in a folder no earlier test of this process had.

    pytest names a test's folder after the first 30 characters of its name and removes a passing
    test's folder at once (``tmp_path_retention_policy = "failed"``), so the next parameter of a
    long-named test is handed the very same path. What this process cached by path then belongs to
    the previous test: MLflow's SQLAlchemy engine for ``sqlite:///<tmp>/mlflow.db`` still holds the
    deleted file ("attempt to write a readonly database"), and an imported ``broken.py`` is the
    previous parameter's. With a file's tests on one worker (``--dist loadgroup``) every such
    parameter pair met, in eleven tests."""
    folder = tmp_path / f"t{next(_TMP_PATHS_HANDED_OUT)}"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def random_policy_dir(tmp_path_factory) -> Path:
    """A random ~0.3M-parameter Qwen2 with the char tokenizer (fast; knows nothing)."""
    from polyrl.policies.text import build_random_text_model_dir

    return build_random_text_model_dir(tmp_path_factory.mktemp("random_policy") / "model", "0.3m", seed=0)


@pytest.fixture(scope="session")
def tiny_arch_dir(tmp_path_factory):
    """``tiny_arch_dir(model_type, tied=None) -> Path``: a random tiny causal LM of a transformers
    architecture (llama, qwen2, qwen3, mistral, gemma3_text, gemma2, phi3; hybrids falcon_h1, lfm2) with a BPE tokenizer
    trained here and a ChatML template, saved as an ordinary HF folder; built once per test run."""
    from polyrl.policies.architectures import build_bpe_tokenizer, build_tiny_arch_dir

    root = tmp_path_factory.mktemp("architectures")
    built: dict[tuple[str, bool | None], Path] = {}
    tokenizer = []

    def make(model_type: str, tied: bool | None = None) -> Path:
        if (model_type, tied) not in built:
            if not tokenizer:
                tokenizer.append(build_bpe_tokenizer())
            name = f"{model_type}-{'default' if tied is None else 'tied' if tied else 'untied'}"
            built[model_type, tied] = build_tiny_arch_dir(model_type, root / name, tied=tied, tokenizer=tokenizer[0])
        return built[model_type, tied]

    return make


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:
    """A tiny chat model: BPE tokenizer trained here, Llama-3-style template that writes BOS itself
    (the tokenizer adds BOS on encode too), end of turn <|eot_id|> != EOS (tests/chat_models.py)."""
    from chat_models import build_chat_model_dir

    return build_chat_model_dir(tmp_path_factory.mktemp("chat_model") / "model", seed=0)


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _write_experiment(folder: Path, config: dict, name: str = "exp.yaml") -> Path:
    path = Path(folder) / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def write_experiment():
    """``write_experiment(folder, config_dict) -> Path`` of a YAML file (a fixture, because
    test modules cannot import from a conftest: several conftest modules share that name)."""
    return _write_experiment


@pytest.fixture
def tiny_experiment(tmp_path, random_policy_dir):
    """Factory: a small experiment dict on the random tiny policy, written under tmp_path."""

    def make(**overrides) -> dict:
        config = {
            "name": "tiny",
            "seed": 0,
            "model": {"path": str(random_policy_dir)},
            "rollout": {"engine": "hf", "prompts_per_step": 4, "samples_per_prompt": 4, "max_tokens": 16},
            "rewards": [{"module": "length", "params": {"unit": "chars"}}],
            "train": {"steps": 3, "learning_rate": 3e-3, "micro_batch_size": 8},
            "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
            "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
        }
        for key, value in overrides.items():
            section = config.setdefault(key, {}) if isinstance(value, dict) else None
            if isinstance(section, dict):
                section.update(value)
            else:
                config[key] = value
        engine = config["rollout"].get("engine", "vllm")  # the schema's default engine
        for key, value in kv_cache_for(engine).items():
            config["rollout"].setdefault(key, value)
        return config

    return make


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups for ``pytest -n 2 --dist loadgroup`` (make test): a file's tests stay on one worker,
    so its module fixtures (a vLLM engine, a built policy) are built once; tests that start a local
    Ray cluster all share one group, so they run one after another: two clusters on a 2-core
    machine starve each other's raylets, and ``ray start --head`` takes fixed ports."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = "ray" if item.get_closest_marker("ray") is not None else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
