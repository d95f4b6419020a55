"""The transformers rollout engine: samples, determinism, parity with the learner, weight sync."""

from __future__ import annotations

import pytest
import torch

from polyrl.models.text import save_model_dir
from rollout_models import PROMPTS, SETTINGS, eos_prone_model, perturbed
from polyrl.algos.logprobs import logprob_gap, pack_completions, token_logprobs
from polyrl.engines.base import build_rollout_engine, rollout_engine_class
from polyrl.engines.hf_engine import HFRolloutEngine
from polyrl.core.types import PromptSample, SamplingSettings







def gap_vs(model, completions, temperature, pad_id):
    batch = pack_completions(completions, pad_token_id=pad_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, temperature=temperature)
    return logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)


def flat(groups):
    return [c for group in groups for c in group]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def setup(request, tmp_path_factory):
    model, tokenizer = eos_prone_model(request.param)
    directory = save_model_dir(model, tokenizer, tmp_path_factory.mktemp("hf"))
    engine = build_rollout_engine("hf", str(directory), seed=0)
    yield engine, model, tokenizer
    engine.close()


def test_registry_and_name(setup):
    engine, _, _ = setup
    assert rollout_engine_class("hf") is HFRolloutEngine and engine.name == "hf"


def test_samples_are_consistent(setup):
    engine, _, tokenizer = setup
    groups = engine.generate(PROMPTS, SETTINGS)
    assert len(groups) == len(PROMPTS)
    eos = tokenizer.eos_token_id
    for prompt, group in zip(PROMPTS, groups):
        assert len(group) == SETTINGS.n
        for c in group:
            assert c.prompt_ids == tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"]
            assert len(c.sampling_logprobs) == len(c.completion_ids) > 0
            assert all(-1e4 < lp <= 1e-6 for lp in c.sampling_logprobs)
            assert eos not in c.completion_ids[:-1]
            if c.finish_reason == "length":
                assert len(c.completion_ids) == SETTINGS.max_tokens and c.completion_ids[-1] != eos
            else:
                assert c.finish_reason == "stop" and c.completion_ids[-1] == eos
            assert c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True)
    assert {c.finish_reason for c in flat(groups)} == {"stop", "length"}


def test_deterministic_for_a_seed(setup):
    engine, _, _ = setup
    first = [c.completion_ids for c in flat(engine.generate(PROMPTS, SETTINGS))]
    again = [c.completion_ids for c in flat(engine.generate(PROMPTS, SETTINGS))]
    other = [c.completion_ids for c in flat(engine.generate(PROMPTS, SamplingSettings(**{**SETTINGS.__dict__, "seed": 12})))]
    assert first == again and first != other


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_matches_learner_logprobs(setup, temperature):
    engine, model, tokenizer = setup
    settings = SamplingSettings(n=4, temperature=temperature, max_tokens=24, seed=3)
    completions = flat(engine.generate(PROMPTS, settings))
    assert gap_vs(model, completions, temperature, tokenizer.pad_token_id) < 1e-4


def test_greedy(setup):
    engine, model, tokenizer = setup
    groups = engine.generate(PROMPTS[:2], SamplingSettings(n=2, temperature=0.0, max_tokens=12))
    assert groups[0][0].completion_ids == groups[0][1].completion_ids
    assert gap_vs(model, flat(groups), 1.0, tokenizer.pad_token_id) < 1e-4


def test_sync_all_weights(setup):
    engine, model, tokenizer = setup
    new = perturbed(model)
    try:
        engine.sync_weights(new.state_dict().items())
        completions = flat(engine.generate(PROMPTS, SETTINGS))
        assert gap_vs(new, completions, 1.0, tokenizer.pad_token_id) < 1e-4
        assert gap_vs(model, completions, 1.0, tokenizer.pad_token_id) > 0.1
        with pytest.raises(AssertionError, match="not in sync"):
            engine.verify_sync(model, PROMPTS)
    finally:
        engine.sync_weights(model.state_dict().items())
    assert engine.verify_sync(model, PROMPTS) < 1e-4


def test_partial_sync_is_detected(setup):
    engine, model, _ = setup
    new = perturbed(model, seed=2)
    try:
        engine.sync_weights((k, v) for k, v in new.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k)
        with pytest.raises(AssertionError, match="not in sync"):
            engine.verify_sync(new, PROMPTS)
    finally:
        engine.sync_weights(model.state_dict().items())


def test_stop_strings_leave_no_padding_in_completions(setup):
    """A row that hits a stop string is padded while the other rows go on generating; its
    completion must end at the token that completes the stop string, with no pad ids (and no
    log-probs of tokens that were never sampled) after it. This random model samples ``<pad>``
    itself now and then; transformers' stop-string check matches on token strings, so a
    sampled ``<pad>`` completes the stop string ``"a"`` and ends that row."""
    engine, model, tokenizer = setup
    stops = ["a", "e", "1", "="]
    settings = SamplingSettings(n=4, temperature=1.0, max_tokens=24, seed=11, stop=stops)
    completions = flat(engine.generate(PROMPTS, settings))
    stopped_early = 0
    for c in completions:
        text = tokenizer.decode(c.completion_ids, skip_special_tokens=False)
        assert len(c.sampling_logprobs) == len(c.completion_ids) == len(c.completion_token_modalities)
        if c.completion_ids[-1] == tokenizer.eos_token_id:
            assert c.finish_reason == "stop"
        elif c.finish_reason == "stop":
            # The last token completes a stop string; the text before it holds none.
            before = tokenizer.decode(c.completion_ids[:-1], skip_special_tokens=False)
            assert any(s in text for s in stops) and not any(s in before for s in stops), c.completion_ids
            assert not any(s in c.text for s in stops)
            stopped_early += len(c.completion_ids) < settings.max_tokens
        else:
            assert c.finish_reason == "length" and len(c.completion_ids) == settings.max_tokens
            assert not any(s in text for s in stops), c.completion_ids  # a padded, stopped row would show here
    assert stopped_early >= 4
    assert gap_vs(model, completions, 1.0, tokenizer.pad_token_id) < 1e-4


def test_unknown_names_rejected(setup):
    engine, _, _ = setup
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.sync_weights([("not.a.weight", torch.zeros(1))])


def test_image_prompt_on_a_text_only_model_is_refused(setup):
    engine, _, _ = setup
    with pytest.raises(ValueError, match="text-only model"):
        engine.generate([PromptSample(prompt="<image>a", images=[object()])], SETTINGS)
