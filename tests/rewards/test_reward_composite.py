"""CompositeReward: weighted totals, None handling, metrics, and errors that name the culprit."""

import math

import pytest
from pydantic import ValidationError

from polyrl.rewards import (
    CompositeReward,
    RewardBatch,
    RewardConfigError,
    RewardModule,
    RewardModuleError,
    RewardSpec,
    register_reward,
)

PREFIX = "polyrl_test_composite_"


@register_reward(PREFIX + "first_char")
class FirstCharValue(RewardModule):
    """The completion's first character as a number; None when it is not a digit."""

    def score(self, batch):
        return [float(c[0]) if c[:1].isdigit() else None for c in batch.completions]


@register_reward(PREFIX + "length")
class CharCount(RewardModule):
    def __init__(self, per_char: float = 1.0):
        self.per_char = per_char

    def score(self, batch):
        return [self.per_char * len(c) for c in batch.completions]


@register_reward(PREFIX + "exploder")
class Exploder(RewardModule):
    """Raises on any completion containing 'boom' (batched or alone)."""

    def score(self, batch):
        for c in batch.completions:
            if "boom" in c:
                raise ValueError("cannot score boom")
        return [0.0] * len(batch)


@register_reward(PREFIX + "batch_only_failure")
class BatchOnlyFailure(RewardModule):
    def score(self, batch):
        if len(batch) > 1:
            raise RuntimeError("fails on batches of more than one")
        return [0.0]


@register_reward(PREFIX + "short")
class ShortList(RewardModule):
    def score(self, batch):
        return [0.0] * (len(batch) - 1)


@register_reward(PREFIX + "nan")
class NaNOnX(RewardModule):
    def score(self, batch):
        return [float("nan") if "x" in c else 1.0 for c in batch.completions]


@register_reward(PREFIX + "string")
class StringScore(RewardModule):
    def score(self, batch):
        return ["1.0"] * len(batch)


def spec(suffix, **kwargs):
    return RewardSpec(module=PREFIX + suffix, **kwargs)


def test_weighted_totals_and_per_module():
    batch = RewardBatch(prompts=["p"] * 3, completions=["3ab", "1", "abcd"])
    reward = CompositeReward([spec("first_char", weight=2.0), spec("length", weight=0.5, params={"per_char": 0.1})])
    result = reward.score(batch)
    assert result.per_module[PREFIX + "first_char"] == [3.0, 1.0, None]
    assert result.per_module[PREFIX + "length"] == pytest.approx([0.3, 0.1, 0.4], abs=1e-12)
    # "3ab": 2.0*3 + 0.5*(0.1*3) = 6 + 0.15 = 6.15;  "1": 2.0*1 + 0.5*0.1 = 2.05
    # "abcd": first_char is None -> the total is None (not 0.5*0.4)
    assert result.totals[0] == pytest.approx(6.15, abs=1e-12)
    assert result.totals[1] == pytest.approx(2.05, abs=1e-12)
    assert result.totals[2] is None


def test_metrics_over_scored_samples_only():
    batch = RewardBatch(prompts=["p"] * 3, completions=["3ab", "1", "abcd"])
    reward = CompositeReward([spec("first_char", name="digit"), spec("length", weight=0.5, params={"per_char": 0.1})])
    metrics = reward.score(batch).metrics()
    # digit: scored [3, 1] -> mean 2, population std sqrt(((3-2)^2 + (1-2)^2)/2) = 1; one None
    assert metrics["reward/digit/mean"] == pytest.approx(2.0, abs=1e-12)
    assert metrics["reward/digit/std"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["reward/digit/unscored"] == 1.0
    # length: [0.3, 0.1, 0.4] -> mean 0.8/3; var = ((0.3-m)^2 + (0.1-m)^2 + (0.4-m)^2)/3
    m = 0.8 / 3
    assert metrics[f"reward/{PREFIX}length/mean"] == pytest.approx(m, abs=1e-12)
    assert metrics[f"reward/{PREFIX}length/std"] == pytest.approx(
        math.sqrt(((0.3 - m) ** 2 + (0.1 - m) ** 2 + (0.4 - m) ** 2) / 3), abs=1e-12
    )
    assert metrics[f"reward/{PREFIX}length/unscored"] == 0.0
    # totals: 3 + 0.5*0.3 = 3.15, 1 + 0.5*0.1 = 1.05, None -> mean 2.1, std 1.05
    assert metrics["reward/mean"] == pytest.approx(2.1, abs=1e-12)
    assert metrics["reward/std"] == pytest.approx(1.05, abs=1e-12)
    assert metrics["reward/unscored"] == 1.0


def test_a_module_that_scores_no_sample_is_an_error_naming_it():
    batch = RewardBatch(prompts=["p", "q"], completions=["abc", "xyz"])
    reward = CompositeReward([spec("length"), spec("first_char", name="digit")])
    with pytest.raises(RewardModuleError, match="reward module 'digit' returned None for all 2 samples") as info:
        reward.score(batch)
    assert info.value.label == "digit" and "allow_unscored: true" in str(info.value)
    # One scored sample is enough (the unscored one is the trainer's to handle):
    # "7" -> length 1 char × 1.0 + first char 7.0 = 8.0; "abc" has no digit -> None.
    assert reward.score(RewardBatch(prompts=["p", "q"], completions=["abc", "7"])).totals == [None, 8.0]


def test_all_unscored_is_allowed_when_the_spec_says_so_and_has_no_mean():
    batch = RewardBatch(prompts=["p"], completions=["abc"])
    metrics = CompositeReward([spec("first_char", allow_unscored=True)]).score(batch).metrics()
    assert metrics == {f"reward/{PREFIX}first_char/unscored": 1.0, "reward/unscored": 1.0}
    assert RewardSpec.model_validate({"module": "rouge_l"}).allow_unscored is False


def test_spec_validation():
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RewardSpec(module="rouge_l", wieght=2.0)
    with pytest.raises(ValidationError, match="finite"):
        RewardSpec(module="rouge_l", weight=float("inf"))
    with pytest.raises(ValidationError, match="on_nonfinite"):
        RewardSpec(module="rouge_l", on_nonfinite="zero")
    assert RewardSpec.model_validate({"module": "rouge_l"}).weight == 1.0


def test_bad_params_name_the_reward():
    with pytest.raises(RewardConfigError, match=r"'length'.*bad params \{'scael': 3\}"):
        CompositeReward([RewardSpec(module="length", params={"scael": 3})])


def test_duplicate_labels_need_a_name():
    with pytest.raises(RewardConfigError, match="two rewards are labelled 'length'"):
        CompositeReward([RewardSpec(module="length"), RewardSpec(module="length", params={"target": 10})])
    CompositeReward([RewardSpec(module="length"), RewardSpec(module="length", name="near10", params={"target": 10})])


def test_exception_names_module_and_sample():
    batch = RewardBatch(prompts=["q0", "q1", "what goes boom?"], completions=["fine", "ok", "it goes boom, loudly"])
    reward = CompositeReward([spec("length"), spec("exploder", name="exploder")])
    with pytest.raises(RewardModuleError) as info:
        reward.score(batch)
    message = str(info.value)
    assert "reward module 'exploder'" in message
    assert "sample 2" in message
    assert "'what goes boom?'" in message and "'it goes boom, loudly'" in message
    assert "cannot score boom" in message
    assert info.value.label == "exploder" and info.value.index == 2


def test_exception_that_no_single_sample_reproduces():
    batch = RewardBatch(prompts=["a", "b"], completions=["x", "y"])
    with pytest.raises(RewardModuleError, match="no single sample fails on its own"):
        CompositeReward([spec("batch_only_failure")]).score(batch)


def test_wrong_length_is_an_error():
    batch = RewardBatch(prompts=["a", "b"], completions=["x", "y"])
    with pytest.raises(RewardModuleError, match=f"'{PREFIX}short' returned 1 scores for a batch of 2 samples"):
        CompositeReward([spec("short")]).score(batch)


def test_non_number_is_an_error():
    batch = RewardBatch(prompts=["a"], completions=["x"])
    with pytest.raises(RewardModuleError, match="returned '1.0' \\(str\\) for sample 0"):
        CompositeReward([spec("string")]).score(batch)


def test_nonfinite_error_by_default_or_none():
    batch = RewardBatch(prompts=["a", "b"], completions=["ok", "xx"])
    with pytest.raises(RewardModuleError, match=f"'{PREFIX}nan' returned nan for sample 1 \\(prompt 'b', completion 'xx'\\)"):
        CompositeReward([spec("nan")]).score(batch)
    result = CompositeReward([spec("nan", on_nonfinite="none")]).score(batch)
    assert result.per_module[PREFIX + "nan"] == [1.0, None]
    assert result.totals == [1.0, None]


def test_setup_called_once_before_score():
    calls = []

    class Counting(RewardModule):
        def setup(self):
            calls.append("setup")

        def score(self, batch):
            calls.append("score")
            return [1.0] * len(batch)

    register_reward(PREFIX + "counting")(Counting)
    reward = CompositeReward([spec("counting")])
    batch = RewardBatch(prompts=["a"], completions=["b"])
    reward.score(batch)
    reward.score(batch)
    assert calls == ["setup", "score", "score"]
