"""The learned scorer: a tiny sequence-classification model built from a config, batched equal to
one pair at a time (padding never moves the scored token), a classifier's class probability,
and its label refused with the field named."""

from __future__ import annotations

import pytest
import torch

from polyrl.reward_models.scorer import LearnedScorer
from polyrl.rewards.base import RewardBatch, RewardConfigError
from polyrl.rewards.composite import CompositeReward

BATCH = RewardBatch(
    prompts=["What is 2 + 2?", "What is 2 + 2?", "Say hi."],
    completions=["4", "It is four, of course, as everyone knows.", "hi"],
)


def test_bradley_terry_scorer_batched_equals_alone(scorer_dirs):
    scorer = LearnedScorer(model=str(scorer_dirs[1]), batch_size=3)
    scores = scorer.score(BATCH)
    assert all(isinstance(s, float) for s in scores) and len(set(scores)) == 3
    alone = [scorer.score(BATCH.subset([i]))[0] for i in range(3)]
    assert scores == pytest.approx(alone, abs=1e-5)
    # The score is the model's logit at the pair's last token (computed here without padding).
    ids = scorer.tokenizer.encode(scorer.text(BATCH.prompts[2], BATCH.completions[2]), add_special_tokens=False)
    with torch.no_grad():
        direct = scorer.model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert scores[2] == pytest.approx(direct, abs=1e-5)


def test_classifier_scores_the_named_class_probability(scorer_dirs):
    by_name = LearnedScorer(model=str(scorer_dirs[3]), label="good").score(BATCH)
    by_index = LearnedScorer(model=str(scorer_dirs[3]), label=2).score(BATCH)
    assert by_name == pytest.approx(by_index) and all(0 < s < 1 for s in by_name)
    with pytest.raises(RewardConfigError, match=r"params.label: the model has 3 outputs"):
        LearnedScorer(model=str(scorer_dirs[3])).setup()
    with pytest.raises(RewardConfigError, match=r"params.label: 'great' is not a class"):
        LearnedScorer(model=str(scorer_dirs[3]), label="great").setup()
    with pytest.raises(RewardConfigError, match=r"params.label: 1 given, but the model has one output"):
        LearnedScorer(model=str(scorer_dirs[1]), label=1).setup()


def test_long_pairs_are_unscored_and_it_works_in_a_composite(scorer_dirs):
    short = LearnedScorer(model=str(scorer_dirs[1]), max_input_tokens=4)
    assert short.score(BATCH) == [None, None, None] and short.stats["too_long"] == 3
    composite = CompositeReward([{"module": "learned_scorer", "params": {"model": str(scorer_dirs[1])}, "weight": 2.0}])
    result = composite.score(BATCH)
    assert result.totals == pytest.approx([2 * s for s in result.per_module["learned_scorer"]])


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    with pytest.raises(RewardConfigError, match=r"params.model: .* is not a model folder"):
        LearnedScorer(model=str(tmp_path)).setup()
