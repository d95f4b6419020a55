"""ReMax (Li et al., arXiv 2310.10505): the collector's one greedy completion per prompt, scored by
the same rewards, becomes the baseline of that prompt's samples and is never trained on."""

from __future__ import annotations

import pytest
import torch
from learner_helpers import ScriptedEngine, built, make_config
from transformers import AutoTokenizer

from polyrl.policies.paths import resolve_policy_path
from polyrl.rollout.batches import Scores


class RecordingEngine(ScriptedEngine):
    """A scripted engine that also keeps the sampling settings of every call."""

    def __init__(self, tokenizer, rounds):
        super().__init__(tokenizer, rounds)
        self.settings = []

    def generate(self, prompts, settings):
        self.settings.append(settings)
        return super().generate(prompts, settings)


def _arm(tmp_path, tiny_experiment, rounds, **overrides):
    config = tiny_experiment(rollout={"prompts_per_step": 2, "samples_per_prompt": 2}, objective={"name": "remax"}, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_policy_path(make_config(config).model)))
    engine = RecordingEngine(tokenizer, rounds)
    return built(tmp_path, config, engine=engine), engine


def test_greedy_completion_is_generated_scored_and_used_as_the_baseline_but_not_trained(tmp_path, tiny_experiment):
    # Reward: length in characters / 100. Sampled: prompt 0 "ab", "abcd"; prompt 1 "a", "abc".
    # Greedy (second call, one per prompt): "abc" (0.03) and "ab" (0.02).
    rounds = [[["ab", "abcd"], ["a", "abc"]], [["abc"], ["ab"]]]
    context, engine = _arm(tmp_path, tiny_experiment, rounds)
    with context as arm:
        assert arm.collector.settings.greedy_baseline
        collected = arm.collector.collect(1)
        batch = arm.pipeline.run(collected.rollout, collected.scores)
    sampled, greedy = engine.settings
    assert (sampled.n, greedy.n, greedy.temperature) == (2, 1, 0.0)
    # Only the sampled completions are in the rollout (and so in the learner's batch).
    assert [c.text for c in collected.rollout.completions] == ["ab", "abcd", "a", "abc"]
    assert len(batch.packed) == 4
    assert collected.scores.baselines == pytest.approx([0.03, 0.03, 0.02, 0.02])
    assert collected.scores.metrics["reward/greedy_baseline_mean"] == pytest.approx(0.025)
    # Advantage R - b on every response token: 0.02 - 0.03, 0.04 - 0.03, 0.01 - 0.02, 0.03 - 0.02
    first_token = batch.advantages[torch.arange(4), batch.packed.response_mask.float().argmax(-1)]
    torch.testing.assert_close(first_token, torch.tensor([-0.01, 0.01, -0.01, 0.01]), atol=1e-6, rtol=0)


def test_other_estimators_generate_no_greedy_sample(tmp_path, tiny_experiment):
    rounds = [[["ab", "abcd"], ["a", "abc"]]]
    context, engine = _arm(tmp_path, tiny_experiment, rounds, advantage={"estimator": "rloo"})
    with context as arm:
        collected = arm.collector.collect(1)
    assert len(engine.settings) == 1 and collected.scores.baselines is None


def test_scores_select_keeps_the_baselines():
    scores = Scores([1.0, 2.0, None], {}, {"m": [1.0, 2.0, None]}, baselines=[0.5, None, 0.7])
    assert scores.select([2, 0]).baselines == [0.7, 0.5]
    assert Scores([1.0], {}).select([0]).baselines is None
