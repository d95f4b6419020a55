"""Safety: lexicon words and regular expressions by category, plus an optional local classifier."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.builtins.text import is_cjk
from polyrl.rewards.registry import register_reward
from polyrl.runtime.devices import resolve_device_name

# Deliberately small and mild: a starting point to be replaced by a project's own lexicons.
DEFAULT_CATEGORIES: dict[str, dict[str, list[str]]] = {
    "violence": {
        "words": ["kill you", "i will hurt you", "how to make a bomb", "build a bomb", "制作炸弹", "杀了你"],
        "patterns": [r"\b(?:shoot|stab|poison)\s+(?:him|her|them|you|people)\b"],
    },
    "self_harm": {
        "words": ["kill yourself", "end your life", "suicide method", "自杀方法"],
        "patterns": [],
    },
    "personal_data": {
        "words": [],
        "patterns": [
            r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b",  # e-mail address
            r"\b\d{3}-\d{2}-\d{4}\b",  # US social security number
            r"\b\d{4}[ -]\d{4}[ -]\d{4}[ -]\d{4}\b",  # card number written in groups of four
        ],
    },
    "secrets": {
        "words": ["-----begin rsa private key-----", "-----begin openssh private key-----"],
        "patterns": [r"\bAKIA[0-9A-Z]{16}\b"],  # AWS access key id
    },
}


@dataclass
class SafetyFinding:
    """One violation: the category and the text that fired (or ``label p=...`` for the classifier)."""

    category: str
    match: str


@dataclass
class SafetyDetails:
    findings: list[SafetyFinding] = field(default_factory=list)

    @property
    def categories(self) -> list[str]:
        return sorted({f.category for f in self.findings})

    @property
    def violated(self) -> bool:
        return bool(self.findings)


def _word_pattern(word: str) -> str:
    """Match a lexicon entry case-insensitively; ASCII word edges must be word boundaries so
    that 'kill' does not fire inside 'skill' (CJK text has no boundaries to require)."""
    escaped = re.escape(word)
    start = r"\b" if word[:1].isalnum() and not is_cjk(word[:1]) else ""
    end = r"\b" if word[-1:].isalnum() and not is_cjk(word[-1:]) else ""
    return start + escaped + end


@register_reward("safety")
class Safety(RewardModule):
    """A penalty when the completion matches a safety rule; 0 otherwise.

    Rules are grouped by category: ``categories: {name: {words: [...], patterns: [...]}}``.
    Words match case-insensitively as whole words (CJK words as substrings); patterns are
    Python regular expressions searched case-insensitively. Given a ``classifier_path``, a
    local Hugging Face text-classification model also flags a sample when the probability of
    any label in ``classifier_labels`` reaches ``classifier_threshold``.

    ``score`` returns ``penalty`` (default −10) for a violating sample and ``safe_reward``
    (default 0) otherwise, and leaves per-sample :class:`SafetyDetails` (which categories and
    which text fired) in ``last_details``; ``score_with_details`` returns both.

    Params:
        categories: the rules; defaults to a small built-in set (violence, self_harm,
            personal_data, secrets). ``extra_categories`` adds to the defaults instead.
        extra_categories: rules merged into ``categories`` (same shape).
        penalty: reward of a violating sample (default -10).
        safe_reward: reward of a clean sample (default 0).
        check_prompt: also check the prompt (default False: only the completion is the
            policy's responsibility).
        classifier_path: local directory of an ``AutoModelForSequenceClassification`` model.
        classifier_labels: labels (names from the model's ``id2label``) that count as unsafe;
            required with ``classifier_path``.
        classifier_threshold: probability (softmax over labels) that flags a sample (0.5).
        classifier_batch_size: texts per classifier forward pass (32).
        device: "cpu", "cuda" or "auto" for the classifier (default "auto").
    """

    def __init__(
        self,
        categories: dict[str, dict[str, list[str]]] | None = None,
        extra_categories: dict[str, dict[str, list[str]]] | None = None,
        penalty: float = -10.0,
        safe_reward: float = 0.0,
        check_prompt: bool = False,
        classifier_path: str | None = None,
        classifier_labels: list[str] | None = None,
        classifier_threshold: float = 0.5,
        classifier_batch_size: int = 32,
        device: str = "auto",
    ):
        rules = dict(DEFAULT_CATEGORIES if categories is None else categories)
        for name, rule in (extra_categories or {}).items():
            rules[name] = rule
        self.rules: dict[str, re.Pattern[str]] = {}
        for name, rule in rules.items():
            if not isinstance(rule, dict) or set(rule) - {"words", "patterns"}:
                raise RewardConfigError(f"safety: category {name!r} must be a mapping with 'words' and/or 'patterns'")
            alternatives = [_word_pattern(w) for w in rule.get("words", []) if w]
            for pattern in rule.get("patterns", []):
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise RewardConfigError(f"safety: category {name!r}: bad pattern {pattern!r}: {error}") from error
                alternatives.append(f"(?:{pattern})")
            if alternatives:
                self.rules[name] = re.compile("|".join(alternatives), re.IGNORECASE)
        if classifier_path and not classifier_labels:
            raise RewardConfigError("safety: classifier_path needs classifier_labels (the labels that count as unsafe)")
        self.penalty = float(penalty)
        self.safe_reward = float(safe_reward)
        self.check_prompt = check_prompt
        self.classifier_path = classifier_path
        self.classifier_labels = list(classifier_labels or [])
        self.classifier_threshold = float(classifier_threshold)
        self.classifier_batch_size = classifier_batch_size
        self.device = device
        self._classifier: Any = None
        self._classifier_tokenizer: Any = None
        self._flag_ids: list[int] = []
        self.last_details: list[SafetyDetails] = []

    def setup(self) -> None:
        if not self.classifier_path or self._classifier is not None:
            return
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = resolve_device_name(self.device)
        self._classifier_tokenizer = AutoTokenizer.from_pretrained(self.classifier_path)
        model = AutoModelForSequenceClassification.from_pretrained(self.classifier_path)
        model.eval().requires_grad_(False)
        self._classifier = model.to(device)
        id2label = {int(k): str(v) for k, v in model.config.id2label.items()}
        label2id = {v: k for k, v in id2label.items()}
        unknown = [label for label in self.classifier_labels if label not in label2id]
        if unknown:
            raise RewardConfigError(f"safety: classifier_labels {unknown} not among the model's labels {sorted(label2id)}")
        self._flag_ids = [label2id[label] for label in self.classifier_labels]

    def _texts(self, batch: RewardBatch) -> list[str]:
        if self.check_prompt:
            return [f"{p}\n{c}" for p, c in zip(batch.prompts, batch.completions)]
        return list(batch.completions)

    def _classify(self, texts: list[str]) -> list[list[SafetyFinding]]:
        import torch

        tok, model = self._classifier_tokenizer, self._classifier
        device = next(model.parameters()).device
        id2label = model.config.id2label
        findings: list[list[SafetyFinding]] = []
        for start in range(0, len(texts), self.classifier_batch_size):
            chunk = texts[start : start + self.classifier_batch_size]
            enc = tok(chunk, return_tensors="pt", padding=True, truncation=True, max_length=getattr(tok, "model_max_length", 512))
            with torch.no_grad():
                probs = model(**{k: v.to(device) for k, v in enc.items()}).logits.float().softmax(-1).cpu()
            for row in probs:
                findings.append(
                    [
                        SafetyFinding(f"classifier:{id2label[j]}", f"p={float(row[j]):.3f}")
                        for j in self._flag_ids
                        if float(row[j]) >= self.classifier_threshold
                    ]
                )
        return findings

    def details(self, batch: RewardBatch) -> list[SafetyDetails]:
        """Which categories fired for each sample, and on what text."""
        if self.classifier_path and self._classifier is None:
            self.setup()
        texts = self._texts(batch)
        out = []
        for text in texts:
            findings = [SafetyFinding(name, match.group(0)) for name, rule in self.rules.items() if (match := rule.search(text))]
            out.append(SafetyDetails(findings))
        if self._classifier is not None and texts:
            for detail, extra in zip(out, self._classify(texts)):
                detail.findings.extend(extra)
        return out

    def score_with_details(self, batch: RewardBatch) -> tuple[list[float | None], list[SafetyDetails]]:
        details = self.details(batch)
        self.last_details = details
        return [self.penalty if d.violated else self.safe_reward for d in details], details

    def score(self, batch: RewardBatch) -> list[float | None]:
        return self.score_with_details(batch)[0]
