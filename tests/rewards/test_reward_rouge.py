"""ROUGE-L with CJK text tokenised per character; LCS values computed by hand."""

import pytest
from rouge_score import rouge_scorer

from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import RougeL, tokenize


def score(completions, references, **params):
    module = RougeL(**params)
    module.setup()
    return module.score(RewardBatch(prompts=[""] * len(completions), completions=completions, references=references))


def test_tokenizer_splits_cjk_per_character_and_lowercases_words():
    assert tokenize("我 LOVE 北京!") == ["我", "love", "北", "京"]
    assert tokenize("私は猫が好き") == ["私", "は", "猫", "が", "好", "き"]
    assert tokenize("나는 학생") == ["나", "는", "학", "생"]
    assert tokenize("ＡＢＣ１２３，好") == ["abc123", "好"]  # full-width folded by NFKC
    assert tokenize("don't-stop_now") == ["don", "t", "stop", "now"]


def test_rouge_score_default_tokenizer_drops_chinese():
    # Why the custom tokenizer exists: rouge-score's default keeps only [a-z0-9].
    default = rouge_scorer.RougeScorer(["rougeL"]).score("我喜欢吃苹果", "我不喜欢苹果")["rougeL"]
    assert default.fmeasure == 0.0


def test_chinese_pairs():
    values = score(
        ["我不喜欢苹果", "天气好", "我们在北京"],
        [["我喜欢吃苹果"], ["今天天气很好"], ["他们在北京", "我们在上海"]],
    )
    # 1) pred 我不喜欢苹果 (6), ref 我喜欢吃苹果 (6): LCS 我喜欢苹果 = 5; P = R = 5/6 -> F = 5/6
    # 2) pred 天气好 (3), ref 今天天气很好 (6): LCS 天气好 = 3; P = 1, R = 1/2 -> F = 2*1*0.5/1.5 = 2/3
    # 3) vs 他们在北京: LCS 们在北京 = 4 of 5 -> F = 0.8; vs 我们在上海: LCS 我们在 = 3 -> 0.6; best 0.8
    assert values == pytest.approx([5 / 6, 2 / 3, 0.8], abs=1e-12)


def test_japanese_korean_and_mixed():
    values = score(["猫が好き", "학생", "我 love 北京!"], [["私は猫が好き"], ["나는 학생"], ["I LOVE 北京"]])
    # 猫が好き (4) in 私は猫が好き (6): LCS 4; P = 1, R = 4/6 -> F = 2*(2/3)/(5/3) = 0.8
    # 학생 (2) in 나는 학생 (4): LCS 2; P = 1, R = 1/2 -> F = 2/3
    # [我, love, 北, 京] vs [i, love, 北, 京]: LCS 3 of 4 each -> F = 0.75
    assert values == pytest.approx([0.8, 2 / 3, 0.75], abs=1e-12)


def test_precision_recall_and_no_reference():
    # pred 天气好 vs ref 今天天气很好: P = 3/3, R = 3/6
    assert score(["天气好"], [["今天天气很好"]], measure="precision") == [1.0]
    assert score(["天气好"], [["今天天气很好"]], measure="recall") == [0.5]
    assert score(["anything", ""], [[], ["今天"]]) == [None, 0.0]
    with pytest.raises(RewardConfigError, match="measure"):
        RougeL(measure="f1")


def test_score_without_explicit_setup():
    module = RougeL()
    batch = RewardBatch(prompts=["p"], completions=["the cat sat"], references=[["the cat sat down"]])
    # LCS 3; P = 1, R = 3/4 -> F = 2*0.75/1.75 = 6/7
    assert module.score(batch) == pytest.approx([6 / 7], abs=1e-12)
