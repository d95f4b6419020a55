"""The transformers rollout engine beyond the shared contract (test_rollout_contract.py):
stop strings in a padded batch, unknown parameter names in a weight sync."""

from __future__ import annotations

import pytest
import torch
from rollout_models import PROMPTS, eos_prone_model, flat, gap_vs

from polyrl.core.types import SamplingSettings
from polyrl.engines.base import build_rollout_engine
from polyrl.policies.text import save_model_dir


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, tokenizer = eos_prone_model(False)
    directory = save_model_dir(model, tokenizer, tmp_path_factory.mktemp("hf"))
    engine = build_rollout_engine("hf", str(directory), seed=0)
    yield engine, model, tokenizer
    engine.close()


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
