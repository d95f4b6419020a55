"""CIDEr-D with document frequencies fixed from the training reference corpus."""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from pycocoevalcap.cider.cider_scorer import CiderScorer, precook

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.builtins.text import tokenize
from polyrl.rewards.registry import register_reward


class _FrozenFrequencies(dict):
    """Document frequencies that read 0 for an unseen n-gram *without inserting it*
    (pycocoevalcap's defaultdict would grow with every new n-gram the policy writes)."""

    def __missing__(self, key):
        return 0.0


class _CorpusCiderScorer(CiderScorer):
    """pycocoevalcap's CiderScorer, with df and log(corpus size) taken from a fixed corpus.

    ``CiderScorer.compute_cider`` (its ``counts2vec``, ``sim``, clipping, Gaussian length
    penalty with sigma and ×10) is reused unchanged; only the corpus statistics differ: it
    would set ``ref_len = log(len(self.crefs))`` from the samples being scored, and this
    subclass keeps the corpus value instead.
    """

    def __init__(self, document_frequency: dict, corpus_size: int, n: int, sigma: float):
        self._corpus_ref_len = float(np.log(float(corpus_size)))
        super().__init__(n=n, sigma=sigma)
        self.document_frequency = document_frequency

    @property
    def ref_len(self) -> float:
        return self._corpus_ref_len

    @ref_len.setter
    def ref_len(self, value) -> None:  # compute_cider assigns log(len(crefs)); keep the corpus's
        pass


@register_reward("cider")
class Cider(RewardModule):
    """CIDEr-D of the completion against its references (a captioning reward).

    As in self-critical sequence training (Rennie et al. 2017, arXiv 1612.00563), the
    document frequencies (and log corpus size) come once from the whole training reference
    corpus, so a sample's reward does not depend on what else is in its batch. Pass the corpus
    as ``corpus_references`` (one list of reference captions per image/prompt) or call
    ``fit_corpus(references)``; training passes its training prompts' references when the
    experiment gives none (``training_references_param``). If none of these happened, the first scored batch's distinct
    reference sets are used and a warning says so.

    Scoring reuses pycocoevalcap's ``CiderScorer`` (``precook``, tf-idf vectors, clipped
    cosine similarity, Gaussian length penalty sigma, mean over n-gram orders and references,
    ×10 — pycocoevalcap's ``Cider`` class is CIDEr-D). With df from the scored set itself,
    the batch mean equals ``pycocoevalcap.cider.cider.Cider().compute_score``.

    Deviation: pycocoevalcap expects text already tokenised by the PTB tokenizer (Java). Here,
    with ``tokenize: true`` (default), text is NFKC-normalised, lowercased, split into words
    with punctuation dropped, and CJK characters become single tokens; ``tokenize: false``
    splits on whitespace only, exactly as pycocoevalcap does.

    A sample without references is unscored (``None``).

    Params:
        corpus_references: the training corpus's references, one list per image/prompt.
        n: largest n-gram order (default 4).
        sigma: standard deviation of the length penalty (default 6.0).
        tokenize: normalise and tokenise as described above (default True).
    """

    # Training passes its prompts' references here when the YAML gives none (trainer/build_data.py).
    training_references_param = "corpus_references"

    def __init__(
        self,
        corpus_references: list[list[str]] | None = None,
        n: int = 4,
        sigma: float = 6.0,
        tokenize: bool = True,
    ):
        if n < 1:
            raise RewardConfigError(f"cider: n must be >= 1, got {n}")
        if sigma <= 0:
            raise RewardConfigError(f"cider: sigma must be > 0, got {sigma}")
        self.n = n
        self.sigma = float(sigma)
        self.tokenize = tokenize
        self.document_frequency: _FrozenFrequencies | None = None
        self.corpus_size = 0
        if corpus_references is not None:
            self.fit_corpus(corpus_references)

    def _prep(self, text: str) -> str:
        return " ".join(tokenize(text)) if self.tokenize else text

    def fit_corpus(self, references: Sequence[Sequence[str]]) -> None:
        """Compute document frequencies from the corpus: one list of references per image.

        Same counting as ``CiderScorer.compute_doc_freq``: an n-gram's df is the number of
        images whose references contain it.
        """
        references = [list(refs) for refs in references if refs]
        if not references:
            raise RewardConfigError("cider: the reference corpus is empty")
        frequencies = _FrozenFrequencies()
        for refs in references:
            cooked = [precook(self._prep(r), self.n) for r in refs]
            for ngram in {ngram for counts in cooked for ngram in counts}:
                frequencies[ngram] = frequencies.get(ngram, 0.0) + 1.0
        self.document_frequency = frequencies
        self.corpus_size = len(references)

    def score(self, batch: RewardBatch) -> list[float | None]:
        if self.document_frequency is None:
            distinct = list(dict.fromkeys(tuple(refs) for refs in batch.references if refs))
            if not distinct:
                return [None] * len(batch)
            warnings.warn(
                "cider: no corpus_references given; document frequencies come from the first batch's "
                f"{len(distinct)} distinct reference sets. Pass the training corpus for stable rewards.",
                stacklevel=2,
            )
            self.fit_corpus(distinct)
        scorer = _CorpusCiderScorer(self.document_frequency, self.corpus_size, self.n, self.sigma)
        scored_indices = []
        for i, (completion, refs) in enumerate(zip(batch.completions, batch.references)):
            if not refs:
                continue
            scorer.crefs.append([precook(self._prep(r), self.n) for r in refs])
            scorer.ctest.append(precook(self._prep(completion), self.n, True))
            scored_indices.append(i)
        out: list[float | None] = [None] * len(batch)
        if scored_indices:
            for i, value in zip(scored_indices, scorer.compute_cider()):
                out[i] = float(value) if math.isfinite(value) else float("nan")
        return out
