"""CIDEr-D with corpus document frequencies, checked against pycocoevalcap."""

import math
import warnings

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider as CocoCider

from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import Cider

GTS = {
    "img1": ["a man riding a horse on a beach", "a person rides a horse near the sea", "a man on a horse"],
    "img2": ["two dogs playing in the snow", "dogs run through snow", "two dogs in a snowy field"],
    "img3": ["a plate of food with broccoli", "a dish of rice and broccoli", "food on a white plate"],
    "img4": ["a red bus on a city street", "a bus driving down the street", "a double decker bus in the city"],
}
RES = {
    "img1": ["a man riding a horse"],
    "img2": ["two dogs playing in snow"],
    "img3": ["a plate with rice and broccoli"],
    "img4": ["a cat sitting on a sofa"],
}


def batch_for(ids):
    return RewardBatch(prompts=list(ids), completions=[RES[i][0] for i in ids], references=[GTS[i] for i in ids])


def test_matches_pycocoevalcap_when_df_is_from_the_same_set():
    ids = list(GTS)
    coco_mean, coco_scores = CocoCider().compute_score(GTS, RES)
    module = Cider(corpus_references=[GTS[i] for i in ids], tokenize=False)
    ours = module.score(batch_for(ids))
    assert np.mean(ours) == pytest.approx(coco_mean, rel=1e-12, abs=1e-12)
    assert ours == pytest.approx(list(coco_scores), rel=1e-12, abs=1e-12)
    assert ours[3] < 0.5 < ours[0]  # the unrelated caption scores near zero
    # Default tokenisation only lowercases and drops punctuation: the same on this clean text.
    assert Cider(corpus_references=[GTS[i] for i in ids]).score(batch_for(ids)) == pytest.approx(ours, abs=1e-12)


def test_scores_do_not_depend_on_the_batch():
    module = Cider(corpus_references=list(GTS.values()))
    together = module.score(batch_for(list(GTS)))
    alone = [module.score(batch_for([i]))[0] for i in GTS]
    assert alone == pytest.approx(together, abs=1e-12)
    # Without a corpus, pycocoevalcap's df from a one-image "corpus" makes every idf 0 -> 0.
    assert CocoCider().compute_score({"img1": GTS["img1"]}, {"img1": RES["img1"]})[0] == 0.0
    assert alone[0] > 1.0


def test_hand_computed_unigram_case():
    # n = 1, corpus of 2 images: A = ["a b"], B = ["a d"]. log corpus size = log 2.
    # df(a) = 2 -> weight log2 - log2 = 0; df(b) = df(d) = 1 -> weight log2 - log(1) = log2.
    # hyp "a b" vs ref "a b": vectors {a: 0, b: log2} both -> cos = 1 -> x10 = 10
    # hyp "b c" vs "a b": hyp {b: log2, c: log2 (df 0 -> log max(1, 0) = 0)}, ref {a: 0, b: log2}
    #   numerator min(log2, log2)*log2 = log2^2; norms sqrt(2)*log2 and log2 -> 1/sqrt(2) -> x10
    # hyp "a" vs "a b": hyp {a: 0} has zero norm -> 0
    # (with n = 1 there are no bigrams, so the length penalty exp(-0/72) = 1)
    module = Cider(corpus_references=[["a b"], ["a d"]], n=1)
    batch = RewardBatch(prompts=["A"] * 3, completions=["a b", "b c", "a"], references=[["a b"]] * 3)
    assert module.score(batch) == pytest.approx([10.0, 10 / math.sqrt(2), 0.0], abs=1e-12)


def test_frequencies_do_not_grow_with_unseen_ngrams():
    module = Cider(corpus_references=list(GTS.values()))
    size = len(module.document_frequency)
    module.score(RewardBatch(prompts=["p"], completions=["zebra quantum xylophone"], references=[GTS["img1"]]))
    assert len(module.document_frequency) == size


def test_fit_on_first_batch_warns_and_no_reference_is_unscored():
    module = Cider()
    batch = RewardBatch(
        prompts=["img1", "img1", "img2", "none"],
        completions=[RES["img1"][0], "a horse", RES["img2"][0], "x"],
        references=[GTS["img1"], GTS["img1"], GTS["img2"], []],
    )
    with pytest.warns(UserWarning, match="first batch's 2 distinct reference sets"):
        first = module.score(batch)
    assert module.corpus_size == 2  # the repeated img1 set counted once
    assert first[3] is None and all(v is not None for v in first[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fitted now: no second warning
        assert module.score(batch) == first


def test_chinese_captions_tokenised_per_character():
    refs = [["一只猫坐在沙发上", "沙发上的猫"], ["两只狗在雪地里玩"]]
    module = Cider(corpus_references=refs)
    batch = RewardBatch(prompts=["a", "b"], completions=["一只猫在沙发上", "一只猫在沙发上"], references=refs)
    matched, unrelated = module.score(batch)
    assert matched > 1.0 and unrelated == pytest.approx(0.0, abs=1e-12)


def test_bad_params():
    with pytest.raises(RewardConfigError, match="empty"):
        Cider(corpus_references=[[]])
    with pytest.raises(RewardConfigError, match="sigma"):
        Cider(sigma=0)
