"""Text normalisation shared by the n-gram rewards (ROUGE-L, CIDEr).

Chinese, Japanese and Korean text has no spaces between words, and rouge-score's default
tokenizer drops every non-ASCII character, so a Chinese completion would score 0 against any
reference. ``CJKTokenizer`` makes each CJK character its own token and lowercases and splits
everything else into runs of letters and digits.
"""

from __future__ import annotations

import re
import unicodedata

# Han (unified, extensions A–F, compatibility), kana, Hangul syllables and jamo.
CJK_RANGES = (
    "\u1100-\u11ff"  # Hangul jamo
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u3130-\u318f"  # Hangul compatibility jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B–G
)
CJK_CHAR = re.compile(f"[{CJK_RANGES}]")
_WORD = re.compile(r"[^\W_]+")


def is_cjk(char: str) -> bool:
    return bool(CJK_CHAR.fullmatch(char))


def tokenize(text: str) -> list[str]:
    """NFKC-normalise and lowercase; each CJK character is a token; other tokens are runs of
    letters/digits (punctuation and underscores separate tokens and are dropped)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = CJK_CHAR.sub(lambda m: f" {m.group(0)} ", text)
    return _WORD.findall(text)


class CJKTokenizer:
    """The tokenizer object rouge-score accepts (``RougeScorer(..., tokenizer=CJKTokenizer())``)."""

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text)
