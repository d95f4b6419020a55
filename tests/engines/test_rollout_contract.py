"""The rollout-engine contract, checked on every registered engine (hf and vLLM) and on a tied and
an untied model: samples and finish reasons, seeding, sampler/learner log-prob parity, greedy and
nucleus sampling, weight sync and its gap check, image prompts refused by a text-only model;
vLLM both eager and compiled (``rollout.compile``).

One engine per parameter (module-scoped, torn down before the next starts, so two vLLM engines
never coexist). Engine-specific behaviour is in test_rollout_hf.py and test_rollout_vllm.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from rollout_models import PROMPTS, SETTINGS, eos_prone_model, flat, gap_vs, perturbed

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import ROLLOUT_ENGINES, build_rollout_engine, rollout_engine_class
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs
from polyrl.policies.text import save_model_dir

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]

_VLLM = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")]
ENGINES = [
    pytest.param(("hf", False), id="hf-untied"),
    pytest.param(("hf", True), id="hf-tied"),
    pytest.param(("vllm", False), id="vllm-untied", marks=_VLLM),
    pytest.param(("vllm", True), id="vllm-tied", marks=_VLLM),
    # rollout.compile: vLLM's compiled forward must sample the learner's distribution and take
    # every weight sync (a compile that froze the start-up weights would fail the sync tests).
    pytest.param(("vllm-compiled", True), id="vllm-compiled-tied", marks=_VLLM),
]
_VLLM_KWARGS = {"kv_cache_gb": 0.25, "max_model_len": 128}
_ENGINE_KWARGS = {
    "hf": ("hf", {}),
    "vllm": ("vllm", _VLLM_KWARGS),
    "vllm-compiled": ("vllm", {**_VLLM_KWARGS, "enforce_eager": False}),
}


@pytest.fixture(scope="module", params=ENGINES)
def setup(request, tmp_path_factory):
    name, tied = request.param
    model, tokenizer = eos_prone_model(tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    directory = save_model_dir(model, tokenizer, tmp_path_factory.mktemp(f"{name}-{'tied' if tied else 'untied'}"))
    engine_name, kwargs = _ENGINE_KWARGS[name]
    engine = build_rollout_engine(engine_name, str(directory), seed=0, **kwargs)
    assert getattr(engine, "compiled", False) == (name == "vllm-compiled")
    yield engine, model, tokenizer, tied
    engine.close()


def test_registered_under_its_name(setup):
    engine, _, _, _ = setup
    assert engine.name in ROLLOUT_ENGINES and isinstance(engine, rollout_engine_class(engine.name))


def test_samples_are_consistent_and_both_finish_reasons_occur(setup):
    engine, _, tokenizer, _ = setup
    groups = engine.generate(PROMPTS, SETTINGS)
    assert len(groups) == len(PROMPTS)
    eos = tokenizer.eos_token_id
    for prompt, group in zip(PROMPTS, groups):
        assert len(group) == SETTINGS.n
        for c in group:
            assert c.prompt_ids == tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"]
            assert len(c.sampling_logprobs) == len(c.completion_ids) == len(c.completion_token_modalities) > 0
            assert all(-1e4 < lp <= 1e-6 for lp in c.sampling_logprobs)
            assert eos not in c.completion_ids[:-1]
            if c.finish_reason == "length":
                assert len(c.completion_ids) == SETTINGS.max_tokens and c.completion_ids[-1] != eos
            else:
                assert c.finish_reason == "stop" and c.completion_ids[-1] == eos
            assert c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True)
    assert {c.finish_reason for c in flat(groups)} == {"stop", "length"}


def test_deterministic_for_a_seed(setup):
    engine, _, _, _ = setup
    first = [c.completion_ids for c in flat(engine.generate(PROMPTS, SETTINGS))]
    again = [c.completion_ids for c in flat(engine.generate(PROMPTS, SETTINGS))]
    other = [c.completion_ids for c in flat(engine.generate(PROMPTS, SamplingSettings(**{**SETTINGS.__dict__, "seed": 12})))]
    assert first == again and first != other
    assert len({tuple(ids) for ids in first[: SETTINGS.n]}) > 1  # the n samples of one prompt differ


@pytest.mark.parametrize(
    "settings", [SETTINGS, SamplingSettings(n=3, temperature=0.7, top_p=0.9, max_tokens=24, seed=5)], ids=["t1", "t0.7-p0.9"]
)
def test_a_prompts_samples_do_not_depend_on_the_rest_of_the_batch(setup, settings):
    """Per-request seeds (engines/base.py): generating the prompts in two calls, the second told
    where its slice starts (first_prompt_index), samples exactly what one call samples. This is
    what lets rollout workers split a batch without changing it (engines/worker_pool.py).
    Log-probs agree to float rounding only: a batch of another shape sums in another order (~1e-7),
    and with top_p < 1 that rounding may move a tail token across the nucleus boundary, which
    changes the renormaliser by that token's share (seen: 6e-5 here). On an Intel Xeon with AMX the
    HF engine's fp32 forward of a 4-row and a 1-row batch differed by up to 5.1e-5 nats at T 1 (the
    GEMM library blocks the two shapes differently), on an AMD EPYC by ~1e-7: the bound is 1e-4, well
    below any real mismatch (a wrong row or position moves log-probs by whole nats), and the ids,
    which are what a split batch must not change, are compared exactly."""
    engine, _, _, _ = setup
    whole = flat(engine.generate(PROMPTS, settings))
    first = flat(engine.generate(PROMPTS[:1], settings))
    rest = flat(engine.generate(PROMPTS[1:], SamplingSettings(**{**settings.__dict__, "first_prompt_index": 1})))
    assert [c.completion_ids for c in whole] == [c.completion_ids for c in first + rest]
    assert [c.finish_reason for c in whole] == [c.finish_reason for c in first + rest]
    for a, b in zip(whole, first + rest):
        assert a.sampling_logprobs == pytest.approx(b.sampling_logprobs, abs=1e-4 if settings.top_p == 1 else 1e-3)
    # The offset is what makes it exact: without it the second call re-uses the first prompt's seeds.
    unshifted = flat(engine.generate(PROMPTS[1:], settings))
    assert [c.completion_ids for c in unshifted] != [c.completion_ids for c in whole[settings.n :]]


def test_completions_carry_the_policy_version(setup):
    engine, model, _, _ = setup
    before = engine.policy_version
    assert {c.policy_version for c in flat(engine.generate(PROMPTS[:1], SETTINGS))} == {before}
    try:
        assert engine.update_weights(model.state_dict().items()) == before + 1  # same weights, next version
        assert {c.policy_version for c in flat(engine.generate(PROMPTS[:1], SETTINGS))} == {before + 1}
    finally:
        engine.update_weights(model.state_dict().items(), version=before)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_matches_learner_logprobs(setup, temperature):
    engine, model, tokenizer, _ = setup
    settings = SamplingSettings(n=4, temperature=temperature, max_tokens=24, seed=3)
    completions = flat(engine.generate(PROMPTS, settings))
    assert gap_vs(model, completions, temperature, tokenizer.pad_token_id) < 1e-4
    # the wrong temperature on the learner side is visibly off
    assert gap_vs(model, completions, 1.0 if temperature != 1.0 else 0.5, tokenizer.pad_token_id) > 1e-2


def test_greedy_and_top_p(setup):
    engine, model, tokenizer, _ = setup
    groups = engine.generate(PROMPTS[:2], SamplingSettings(n=2, temperature=0.0, max_tokens=12, seed=0))
    assert groups[0][0].completion_ids == groups[0][1].completion_ids
    assert gap_vs(model, flat(groups), 1.0, tokenizer.pad_token_id) < 1e-4
    # top_p < 1: log-probs are renormalised over the nucleus, so they are >= the learner's.
    completions = flat(engine.generate(PROMPTS[:2], SamplingSettings(n=4, temperature=1.0, top_p=0.5, max_tokens=12, seed=0)))
    batch = pack_completions(completions, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch)
    mask = batch.response_mask.bool()
    assert torch.all(batch.sampling_logprobs[mask] >= learner[mask] - 1e-4)
    assert logprob_gap(batch.sampling_logprobs, learner, mask) > 1e-2


def test_sync_all_weights(setup):
    engine, model, tokenizer, _ = setup
    new = perturbed(model)
    try:
        engine.sync_weights(new.state_dict().items())
        completions = flat(engine.generate(PROMPTS, SETTINGS))
        assert gap_vs(new, completions, 1.0, tokenizer.pad_token_id) < 1e-4
        assert gap_vs(model, completions, 1.0, tokenizer.pad_token_id) > 0.1
        assert engine.verify_sync(new, PROMPTS) < 1e-4
        with pytest.raises(AssertionError, match="not in sync"):
            engine.verify_sync(model, PROMPTS)
    finally:
        engine.sync_weights(model.state_dict().items())
    assert engine.verify_sync(model, PROMPTS) < 1e-4


def test_a_sync_that_leaves_the_output_head_stale_is_detected(setup):
    """Untied: the head is left out; tied: the shared embedding/head tensor is left out."""
    engine, model, _, tied = setup
    left_out = ("embed_tokens", "lm_head") if tied else ("lm_head",)
    new = perturbed(model, seed=2)
    try:
        engine.sync_weights((k, v) for k, v in new.state_dict().items() if not any(name in k for name in left_out))
        with pytest.raises(AssertionError, match="not in sync"):
            engine.verify_sync(new, PROMPTS)
    finally:
        engine.sync_weights(model.state_dict().items())


def test_an_image_prompt_to_a_text_only_model_is_refused(setup):
    engine, _, _, _ = setup
    with pytest.raises(ValueError, match="text-only model"):
        engine.generate([PromptSample(prompt="<image> a", images=[object()])], SETTINGS)
