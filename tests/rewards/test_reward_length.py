"""Length rewards: linear, target, cap and DAPO's soft overlong punishment."""

import pytest

from polyrl.policies.text import build_char_tokenizer
from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import Length


def lengths_batch(*lengths):
    return RewardBatch(prompts=[""] * len(lengths), completions=["a" * n for n in lengths])


def test_linear_default_is_len_over_100():
    # 0/100 = 0, 37/100 = 0.37, 250/100 = 2.5
    assert Length().score(lengths_batch(0, 37, 250)) == pytest.approx([0.0, 0.37, 2.5], abs=1e-12)


def test_target_and_cap():
    # target 100, scale 100: |130-100|/100 = 0.3 -> -0.3; |70-100|/100 -> -0.3; exact -> 0
    assert Length(target=100).score(lengths_batch(130, 70, 100)) == pytest.approx([-0.3, -0.3, 0.0], abs=1e-12)
    # cap 1.0 bounds 250/100 = 2.5 at 1.0; 50/100 = 0.5 untouched
    assert Length(cap=1.0).score(lengths_batch(250, 50)) == pytest.approx([1.0, 0.5], abs=1e-12)
    # scale 50: 25/50 = 0.5
    assert Length(scale=50).score(lengths_batch(25)) == pytest.approx([0.5], abs=1e-12)


def test_dapo_soft_overlong_punishment():
    # L_max 100, L_cache 20: 0 up to 80, then (80 - L)/20, -1 beyond 100
    module = Length(overlong_max_length=100, overlong_cache_length=20)
    assert module.score(lengths_batch(10, 80, 85, 90, 100, 101, 500)) == pytest.approx(
        [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0], abs=1e-12
    )
    assert module.reward(81) == pytest.approx(-0.05, abs=1e-12)  # (80-81)/20, in float64


def test_token_unit(tmp_path):
    build_char_tokenizer().save_pretrained(tmp_path)
    module = Length(unit="tokens", tokenizer_path=str(tmp_path), scale=10)
    module.setup()
    # the character tokenizer makes one token per character: "ab cd" -> 5 tokens -> 5/10
    batch = RewardBatch(prompts=["", ""], completions=["ab cd", ""])
    assert module.score(batch) == pytest.approx([0.5, 0.0], abs=1e-12)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"unit": "words"}, "unit must be"),
        ({"unit": "tokens"}, "needs tokenizer_path"),
        ({"scale": 0}, "scale must be > 0"),
        ({"overlong_max_length": 100}, "needs overlong_cache_length"),
        ({"overlong_max_length": 100, "overlong_cache_length": 200}, "overlong_cache_length"),
        ({"overlong_cache_length": 10}, "needs overlong_max_length"),
        ({"target": 10, "overlong_max_length": 100, "overlong_cache_length": 10}, "not both"),
    ],
)
def test_bad_params(params, message):
    with pytest.raises(RewardConfigError, match=message):
        Length(**params)
