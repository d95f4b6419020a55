"""The rollout collector alone: a scripted engine (a fake for the logic around generation), the
real `length` reward, prompts from a list. No learner, no model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.base import RolloutEngine
from polyrl.policies.text import build_char_tokenizer
from polyrl.rewards import CompositeReward
from polyrl.rollout.collector import Collected, CollectSettings, RolloutCollector


class ScriptedEngine(RolloutEngine):
    """Answers the i-th ``generate`` call with ``rounds[i]`` (one list of texts per prompt)."""

    name = "scripted"

    def __init__(self, rounds: list[list[list[str]]]):
        self.tokenizer = build_char_tokenizer()
        self.rounds, self.settings, self.synced = rounds, [], []

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        self.settings.append(settings)
        texts = self.rounds[len(self.settings) - 1]
        assert len(texts) == len(prompts) and all(len(group) == settings.n for group in texts)
        return [[self._completion(p.prompt, t) for t in group] for p, group in zip(prompts, texts)]

    def _completion(self, prompt: str, text: str) -> Completion:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return Completion(
            prompt_ids=list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]),
            completion_ids=ids,
            text=text,
            sampling_logprobs=[-1.0] * len(ids),
            finish_reason="stop",
        )

    def sync_weights(self, named_tensors) -> None:
        self.synced.extend(name for name, _ in named_tensors)


def _prompts():
    counter = iter(range(1000))
    return lambda n: [PromptSample(prompt=f"Q{next(counter)}:") for _ in range(n)]


def _collector(rounds, *, dynamic=False, max_rounds=1, accuracy_label=None, prompts=2, samples=2):
    rewards = CompositeReward([{"module": "length", "name": "len", "params": {"unit": "chars"}}])
    rewards.setup()
    settings = CollectSettings(
        prompts_per_step=prompts,
        samples_per_prompt=samples,
        temperature=0.7,
        max_tokens=8,
        seed=3,
        dynamic_sampling=dynamic,
        max_rounds=max_rounds,
        accuracy_label=accuracy_label,
    )
    engine = ScriptedEngine(rounds)
    return RolloutCollector(engine, rewards, _prompts(), settings), engine


def test_collect_flattens_groups_prompt_major_scores_them_and_seeds_each_step():
    collector, engine = _collector([[["a", "abc"], ["", "ab"]]], accuracy_label="len")
    collected = collector.collect(step=5)
    assert isinstance(collected, Collected) and dataclasses.is_dataclass(collected)
    rollout, scores = collected.rollout, collected.scores
    assert [p.prompt for p in rollout.prompts] == ["Q0:", "Q0:", "Q1:", "Q1:"]
    assert rollout.group_ids.tolist() == [0, 0, 1, 1]
    # length reward: len/100 → 0.01, 0.03, 0, 0.02; accuracy: 3 of 4 are > 0.
    assert scores.totals == pytest.approx([0.01, 0.03, 0.0, 0.02])
    assert scores.metrics["train/accuracy"] == 0.75
    # seed = 3 × 1_000_003 + 5 × 101 + round 0 = 3_000_514
    assert engine.settings[0] == SamplingSettings(n=2, temperature=0.7, top_p=1.0, max_tokens=8, seed=3_000_514)
    assert set(collected.seconds) == {"generate", "score"} and all(s >= 0 for s in collected.seconds.values())


def test_without_an_accuracy_label_there_is_no_accuracy_metric():
    collector, _ = _collector([[["a", "abc"], ["", "ab"]]])
    assert "train/accuracy" not in collector.collect(1).scores.metrics


def test_dynamic_sampling_refills_with_informative_groups_only_and_counts_them():
    informative, flat = ["ab", "abcd"], ["abc", "xyz"]
    rounds = [[informative, flat], [flat, informative]]
    collector, engine = _collector(rounds, dynamic=True, max_rounds=3)
    collected = collector.collect(step=1)
    # Round 1 keeps group 0, drops group 1; round 2 (groups 2, 3) keeps group 3 and stops: 2 groups.
    assert collected.rollout.group_ids.tolist() == [0, 0, 3, 3]
    assert [c.text for c in collected.rollout.completions] == informative * 2
    assert [s.seed for s in engine.settings] == [1_000_003 * 3 + 101, 1_000_003 * 3 + 101 + 1]
    m = collected.scores.metrics
    assert (
        m["rollout/dynamic_sampling_rounds"],
        m["rollout/dynamic_sampling_dropped_groups"],
        m["rollout/dynamic_sampling_kept_groups"],
        m["rollout/dynamic_sampling_missing_groups"],
    ) == (2, 2, 2, 0)
    # reward/mean covers all 8 generated samples: (0.02 + 0.04) × 2 + 0.03 × 4 over 8.
    assert m["reward/mean"] == pytest.approx((0.12 + 0.12) / 8)


def test_sync_weights_reaches_the_engine():
    collector, engine = _collector([])
    collector.sync_weights(iter([("w", torch.zeros(1)), ("b", torch.zeros(1))]))
    assert engine.synced == ["w", "b"]


def test_dynamic_sampling_keeps_each_kept_rows_reward_components():
    """The kept rows' per-component rewards (Scores.per_module), in the merged rows' order: dropped
    before, so the component, judge-drift and inspector checks never ran under dynamic sampling."""
    informative, flat = ["ab", "abcd"], ["abc", "xyz"]
    collector, _ = _collector([[informative, flat], [flat, ["a", "abcde"]]], dynamic=True, max_rounds=3)
    scores = collector.collect(step=1).scores
    # Kept: round 1's group 0 ("ab", "abcd") and round 2's group 3 ("a", "abcde"); len/100 each.
    assert scores.per_module == {"len": pytest.approx([0.02, 0.04, 0.01, 0.05])}
    assert scores.totals == pytest.approx([0.02, 0.04, 0.01, 0.05])
