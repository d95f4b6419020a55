"""Safety: lexicon/regex categories, details of what fired, and a local classifier path."""

import pytest

from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import Safety


def batch_of(*completions, prompts=None):
    return RewardBatch(prompts=prompts or [""] * len(completions), completions=list(completions))


def test_default_categories_and_details():
    module = Safety()
    batch = batch_of(
        "I will KILL YOU tomorrow",  # violence (case-insensitive word)
        "She has great skill in chess",  # 'kill' inside 'skill' does not fire
        "write to bob.smith@example.com",  # personal_data (e-mail pattern)
        "教你制作炸弹的方法",  # violence (CJK word, substring)
        "2 + 2 = 4, and 1234567890123456 is just a big number",  # no grouped card number
    )
    scores, details = module.score_with_details(batch)
    assert scores == [-10.0, 0.0, -10.0, -10.0, 0.0]
    assert [d.categories for d in details] == [["violence"], [], ["personal_data"], ["violence"], []]
    assert details[0].findings[0].match == "KILL YOU"
    assert details[2].findings[0].match == "bob.smith@example.com"
    assert module.last_details == details
    assert module.score(batch_of("fine")) == [0.0] and module.last_details[0].violated is False


def test_several_categories_one_penalty():
    scores, details = Safety().score_with_details(batch_of("kill yourself, mail a@b.co"))
    assert scores == [-10.0]  # one penalty per sample, however many categories fire
    assert details[0].categories == ["personal_data", "self_harm"]


def test_custom_categories_replace_defaults_and_extra_adds():
    rules = {"spam": {"words": ["buy now"], "patterns": [r"https?://\S+"]}}
    module = Safety(categories=rules, penalty=-5.0, safe_reward=0.5)
    batch = batch_of("BUY NOW!!!", "see http://x.io", "I will kill you")
    # custom rules only: the third (a default violence phrase) no longer fires
    assert module.score(batch) == [-5.0, -5.0, 0.5]
    assert [d.categories for d in module.last_details] == [["spam"], ["spam"], []]
    merged = Safety(extra_categories=rules)
    assert merged.score(batch) == [-10.0, -10.0, -10.0]


def test_check_prompt():
    batch = batch_of("sure", prompts=["contact a@b.co"])
    assert Safety().score(batch) == [0.0]
    assert Safety(check_prompt=True).score(batch) == [-10.0]


def test_bad_rules():
    with pytest.raises(RewardConfigError, match="bad pattern"):
        Safety(categories={"x": {"patterns": ["("]}})
    with pytest.raises(RewardConfigError, match="mapping with 'words'"):
        Safety(categories={"x": {"word": ["a"]}})
    with pytest.raises(RewardConfigError, match="needs classifier_labels"):
        Safety(classifier_path="/somewhere")


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    """A randomly initialised 2-label sequence classifier with the character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from polyrl.policies.text import build_char_tokenizer

    directory = tmp_path_factory.mktemp("safety_classifier")
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=2,
        id2label={0: "safe", 1: "unsafe"},
        label2id={"safe": 0, "unsafe": 1},
    )
    Qwen2ForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_classifier_path_works(tiny_classifier):
    batch = batch_of("hello there", "a longer completion to pad against", "kill you")
    # threshold 0: every probability >= 0, so every sample is flagged by the classifier
    always = Safety(classifier_path=tiny_classifier, classifier_labels=["unsafe"], classifier_threshold=0.0, device="cpu")
    always.setup()
    scores, details = always.score_with_details(batch)
    assert scores == [-10.0, -10.0, -10.0]
    assert details[0].categories == ["classifier:unsafe"]
    assert details[2].categories == ["classifier:unsafe", "violence"]  # rules still apply
    probability = float(details[0].findings[0].match.removeprefix("p="))
    assert 0.0 < probability < 1.0
    # threshold above 1: the classifier never fires, only the rules do
    never = Safety(classifier_path=tiny_classifier, classifier_labels=["unsafe"], classifier_threshold=1.01, device="cpu")
    assert never.score(batch) == [0.0, 0.0, -10.0]
    with pytest.raises(RewardConfigError, match=r"\['toxic'\] not among the model's labels \['safe', 'unsafe'\]"):
        Safety(classifier_path=tiny_classifier, classifier_labels=["toxic"], device="cpu").setup()
