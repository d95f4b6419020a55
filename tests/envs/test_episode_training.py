"""Training on episodes end to end (HF engine; vLLM marked): a bad tool (raises, hangs, returns
10 MB) leaves the run going, its error an observation; the shipped data sources load."""

from __future__ import annotations

import math

import pytest

from tests.engine_settings import kv_cache_for

BAD_TOOL_ENV = '''
import time

from polyrl.envs import Step, ToolCall, ToolEnvironment, run_tool_call, tool


@tool
def raises() -> str:
    """Fails."""
    raise RuntimeError("the tool broke")


@tool
def hangs() -> str:
    """Never returns in time."""
    time.sleep(60)
    return "late"


@tool
def huge() -> str:
    """Ten megabytes."""
    return "x" * 10_000_000


BAD = [raises, hangs, huge]


class BadToolEnv(ToolEnvironment):
    """Turn 1: each bad tool is called whatever the policy wrote (a random policy writes no calls);
    turn 2: a reward that varies with the answer's length (so advantages are not all 0), done."""

    # Offered to the policy: none (three schemas in the system message would outgrow the tiny
    # model's 512 positions); called: all three.
    tools = []

    def __init__(self):
        self.turn = 0

    def start(self, row):
        return [{"role": "user", "content": row.prompt}]

    def step(self, text):
        self.turn += 1
        if self.turn == 1:
            results = [run_tool_call(ToolCall(t.name, {}), BAD, timeout_s=self.tool_timeout_s,
                                     output_chars=self.tool_output_chars) for t in BAD]
            return Step([{"role": "tool", "name": r.name, "content": r.content} for r in results],
                        tool_calls=len(results), tool_errors=sum(not r.ok for r in results))
        return Step(reward=float(len(text) % 3), done=True)
'''


def _config(tmp_path, model_dir, engine: str) -> dict:
    return {
        "name": "episodes",
        "seed": 0,
        "model": {"path": str(model_dir)},
        "data": {"source": "guess_number"},
        "env": {
            "module": f"{tmp_path / 'bad_tool_env.py'}:BadToolEnv",
            "max_turns": 3,
            "max_episode_tokens": 300,
            "tool_timeout_s": 0.3,
            "tool_output_chars": 100,
            # The random tiny model never writes its end-of-turn token; "e" ends its turns early.
            "stop": ["e"],
        },
        "rollout": {
            "engine": engine,
            "prompts_per_step": 2,
            "samples_per_prompt": 4,
            "max_tokens": 8,
            "max_model_len": 512,
            **kv_cache_for(engine),
        },  # fmt: skip
        "train": {"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
    }


def _train(tmp_path, tiny_arch_dir, write_experiment, engine: str):
    import mlflow
    from safetensors.torch import load_file

    from polyrl.launch.runner import run_experiment

    (tmp_path / "bad_tool_env.py").write_text(BAD_TOOL_ENV)
    model_dir = tiny_arch_dir("qwen2")
    path = write_experiment(tmp_path, _config(tmp_path, model_dir, engine))
    run_id = run_experiment(path, show_progress=False).arm_run_ids["main"]
    metrics = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.metrics
    before = load_file(str(model_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "runs" / "episodes" / "main" / "step_000002" / "policy.safetensors"))
    changed = any(not (before[k] == after[k]).all() for k in before if k in after)
    return metrics, changed


@pytest.mark.slow
def test_bad_tools_leave_the_hf_run_going(tmp_path, tiny_arch_dir, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    metrics, changed = _train(tmp_path, tiny_arch_dir, write_experiment, "hf")
    assert math.isfinite(metrics["actor/loss"])
    assert changed
    # Each episode whose first turn ended (not cut by max_tokens) called the three tools once; the
    # one that raised and the one that hung are errors, the 10 MB one came back capped (ok): all
    # three were observations, and the episodes went on to a second turn.
    assert metrics["episode/tool_calls_mean"] > 0
    assert metrics["episode/tool_errors_mean"] == pytest.approx(2 / 3 * metrics["episode/tool_calls_mean"])
    assert metrics["episode/turns_mean"] > 1.0
    assert metrics["episode/observation_tokens_mean"] > 0
    # The learner scored the sampler's own ids: the log-prob gap on the policy's tokens is ~0.
    assert metrics["rollout/logprob_gap"] < 1e-4


@pytest.mark.slow
@pytest.mark.vllm
def test_episodes_train_through_vllm(tmp_path, tiny_arch_dir, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    metrics, changed = _train(tmp_path, tiny_arch_dir, write_experiment, "vllm")
    assert math.isfinite(metrics["actor/loss"])
    assert changed
    assert metrics["episode/tool_errors_mean"] == pytest.approx(2 / 3 * metrics["episode/tool_calls_mean"])
    assert metrics["episode/turns_mean"] > 1.0
    assert metrics["rollout/logprob_gap"] < 1e-3


def test_shipped_episode_sources_load_with_their_fields():
    from polyrl.data.prompts import load_prompt_dataset

    calc = load_prompt_dataset("calculator", "test")
    assert {"a", "b", "answer"} <= set(calc.column_names)
    guess = load_prompt_dataset("guess_number", "train")
    assert {"target", "high"} <= set(guess.column_names)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("env", ["calculator", "guess_number"])
def test_shipped_environments_train_through_vllm(tmp_path, tiny_arch_dir, write_experiment, monkeypatch, env):
    import mlflow

    from polyrl.launch.runner import run_experiment

    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, tiny_arch_dir("qwen2"), "vllm")
    config["data"] = {"source": env}
    config["env"] = {"module": env, "max_turns": 3, "max_episode_tokens": 120, "stop": ["e"]}
    config["rollout"]["prompts_per_step"] = 2
    config["rollout"]["samples_per_prompt"] = 2
    run_id = run_experiment(write_experiment(tmp_path, config), show_progress=False).arm_run_ids["main"]
    metrics = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.metrics
    # The random policy solves nothing (returns 0, so no update moves it): what is checked is that
    # the shipped environments run two whole steps of episodes through vLLM, masked and scored.
    assert math.isfinite(metrics["actor/loss"])
    assert metrics["episode/turns_mean"] >= 1.0
    assert "reward/env/mean" in metrics
    assert metrics["rollout/logprob_gap"] < 1e-3
