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


# --- folders that cannot score: refused at set-up, naming the folder and what is wrong ------------


def test_a_causal_lm_folder_is_refused_naming_its_untrained_head(chat_model_dir):
    # transformers loads a causal LM as a two-output classifier with a random `score` head and
    # only logs it; before, polyrl asked for a label and, given `label: 1`, scored with that noise.
    for label in (None, 1):
        with pytest.raises(RewardConfigError) as caught:
            LearnedScorer(model=str(chat_model_dir), label=label).setup()
        message = str(caught.value)
        assert str(chat_model_dir) in message and "score.weight" in message and "at random" in message, message
        assert "name the class" not in message


def test_a_truncated_checkpoint_is_refused_naming_the_file(scorer_dirs, tmp_path):
    import shutil

    folder = tmp_path / "cut"
    shutil.copytree(scorer_dirs[1], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted copy
    with pytest.raises(RewardConfigError, match=r"params.model: .*model\.safetensors' does not read as safetensors"):
        LearnedScorer(model=str(folder)).setup()


def test_a_tokenizer_larger_than_the_embedding_is_refused_with_both_sizes(chat_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    rows = len(tokenizer) - 10  # the tokenizer's last 10 ids have no embedding row
    config = Qwen3Config(vocab_size=rows, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_labels=1)  # fmt: skip
    folder = tmp_path / "small_embedding"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(RewardConfigError) as caught:
        LearnedScorer(model=str(folder)).setup()
    message = str(caught.value)
    assert f"{len(tokenizer)} tokens" in message and f"only {rows} rows" in message and str(folder) in message


def test_a_missing_scorer_folder_is_refused_when_the_module_is_built(tmp_path):
    # Built at polyrl validate (the YAML check builds each reward module), not at the first step's scoring.
    from polyrl.reward_models.scorer import LearnedScorer

    with pytest.raises(RewardConfigError, match="learned_scorer params.model: .*is not a model folder"):
        LearnedScorer(model=str(tmp_path / "no_such_scorer"))
