"""ROUGE-L against the best reference, with CJK text tokenised per character."""

from __future__ import annotations

from typing import Literal

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.builtins.text import CJKTokenizer
from polyrl.rewards.registry import register_reward


@register_reward("rouge_l")
class RougeL(RewardModule):
    """ROUGE-L (longest common subsequence) of the completion against its references.

    Uses rouge-score's ``RougeScorer(['rougeL'])`` with a tokenizer that makes every Chinese,
    Japanese or Korean character a token and lowercases and splits other text into words
    (rouge-score's own tokenizer deletes CJK characters). The score is the best over the
    sample's references; a sample without references is unscored (``None``).

    Params:
        measure: "fmeasure" (default), "precision" or "recall" of the LCS.
        use_stemmer: apply rouge-score's Porter stemmer to English words (default False).
    """

    def __init__(self, measure: Literal["fmeasure", "precision", "recall"] = "fmeasure", use_stemmer: bool = False):
        if measure not in ("fmeasure", "precision", "recall"):
            raise RewardConfigError(f"rouge_l: measure must be fmeasure, precision or recall, got {measure!r}")
        self.measure = measure
        self.use_stemmer = use_stemmer
        self._scorer = None

    def setup(self) -> None:
        from rouge_score import rouge_scorer

        tokenizer = CJKTokenizer()
        if self.use_stemmer:
            tokenizer = _StemmingTokenizer(tokenizer)
        self._scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=tokenizer)

    def score(self, batch: RewardBatch) -> list[float | None]:
        if self._scorer is None:
            self.setup()
        out: list[float | None] = []
        for completion, references in zip(batch.completions, batch.references):
            if not references:
                out.append(None)
                continue
            best = max(getattr(self._scorer.score(ref, completion)["rougeL"], self.measure) for ref in references)
            out.append(float(best))
        return out


class _StemmingTokenizer:
    def __init__(self, inner: CJKTokenizer):
        from nltk.stem import porter

        self.inner = inner
        self.stemmer = porter.PorterStemmer()

    def tokenize(self, text: str) -> list[str]:
        return [self.stemmer.stem(t) if len(t) > 3 and t.isascii() else t for t in self.inner.tokenize(text)]
