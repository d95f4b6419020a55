"""The judge reward: reading a score (hand-computed), then a real tiny chat model as the judge:
batched equals one at a time, the cache, the budgets, unreadable answers left unscored, relative
(group) judging, and its parameters refused with the field named."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.reward_models.judge import JudgeReward
from polyrl.reward_models.reading import expected_score, groups_of, numbered, parse_score
from polyrl.rewards.base import RewardBatch, RewardConfigError
from polyrl.rewards.composite import CompositeReward
from polyrl.rewards.registry import load_reward_class, registered_rewards

PROMPTS = ["What is 2 + 2?", "Name a colour.", "Say hello."]
COMPLETIONS = ["4", "four, I think", "blue", "the sea", "hello", "goodbye"]


def _batch() -> RewardBatch:
    return RewardBatch(prompts=[p for p in PROMPTS for _ in range(2)], completions=list(COMPLETIONS))


def test_expected_score_hand_computed():
    # Logits all 0 over a vocabulary of 5: p = 0.2 each. Score tokens 1 and 2 carry scores 1 and 5:
    # mass 0.4; expected (0.2·1 + 0.2·5) / 0.4 = 3.
    value, mass = expected_score(torch.zeros(5), [1, 2], [1.0, 5.0], min_mass=0.1)
    assert value == pytest.approx(3.0) and mass == pytest.approx(0.4)
    # Logits (0, ln 3, 0, 0, 0): p = (1, 3, 1, 1, 1)/7; tokens 1,2 → 3/7 and 1/7; expected (3·1 + 1·5)/4 = 2.
    value, mass = expected_score(torch.tensor([0.0, math.log(3), 0, 0, 0]), [1, 2], [1.0, 5.0], min_mass=0.1)
    assert value == pytest.approx(2.0) and mass == pytest.approx(4 / 7)
    # Below the minimum mass the judge did not answer with a score: unscored, not renormalised.
    assert expected_score(torch.zeros(5), [1, 2], [1.0, 5.0], min_mass=0.5)[0] is None


def test_parse_groups_and_numbering():
    assert parse_score("Score: 4/5", [1, 2, 3, 4, 5]) == 4.0
    assert parse_score("I'd say 7", [1, 2, 3, 4, 5]) is None  # not an allowed score
    assert parse_score("great answer", [1, 2, 3]) is None
    assert groups_of(["a", "a", "b", "a"]) == [[0, 1], [2], [3]]
    assert numbered(["x ", "y"]) == "Answer 1: x\n\nAnswer 2: y"


def test_judge_and_scorer_are_registered():
    assert {"judge", "learned_scorer"} <= set(registered_rewards())
    assert load_reward_class("judge") is JudgeReward


@pytest.fixture(scope="module")
def judge_factory(chat_model_dir):
    made: list[JudgeReward] = []

    def make(**params) -> JudgeReward:
        judge = JudgeReward(model=str(chat_model_dir), **params)
        judge.setup()
        made.append(judge)
        return judge

    yield make
    for judge in made:
        judge.close()


def test_probability_judge_batched_equals_alone_and_uses_its_cache(judge_factory):
    # A random tiny model puts little mass on the five digits, so the minimum mass is lowered here.
    judge = judge_factory(min_score_mass=1e-9, batch_size=4)
    batch = _batch()
    scores = judge.score(batch)
    assert all(s is not None and 1.0 <= s <= 5.0 for s in scores)
    assert judge.stats["judged"] == 6 and judge.stats["cached"] == 0 and judge.stats["tokens"] > 0
    alone = JudgeReward(model=judge.model, min_score_mass=1e-9, batch_size=1)
    alone.engine, alone.score_token_ids = judge.engine, judge.score_token_ids  # the same loaded judge, batch of 1
    assert alone.score(batch) == pytest.approx(scores, abs=1e-5)
    again = judge.score(batch)
    assert again == scores and judge.stats["cached"] == 6 and judge.stats["judged"] == 0
    # The cache is keyed on the judge input: another rubric is judged afresh.
    other = judge_factory(min_score_mass=1e-9, rubric="Grade: {completion} for {prompt}. One of {scores}:")
    other.score(batch)
    assert other.stats["judged"] == 6


def test_a_judge_that_does_not_answer_with_a_score_leaves_samples_unscored(judge_factory):
    judge = judge_factory()  # min_score_mass 0.5: the random model's digits carry far less
    assert judge.score(_batch()) == [None] * 6
    assert judge.stats["unreadable"] == 6
    parsed = judge_factory(read="parsed", max_new_tokens=4)
    assert all(s is None or s in (1, 2, 3, 4, 5) for s in parsed.score(_batch()))


def test_budgets_and_long_inputs_leave_samples_unscored(judge_factory):
    batch = _batch()
    judge = judge_factory(min_score_mass=1e-9, batch_size=2)
    one_chunk = sum(len(judge.engine.tokenizer.encode(t, add_special_tokens=False)) + 1 for t in judge.judge_inputs(batch)[:2])
    budgeted = judge_factory(min_score_mass=1e-9, batch_size=2, token_budget=one_chunk, cache_size=0)
    scores = budgeted.score(batch)
    assert scores[:2] != [None, None] and scores[2:] == [None] * 4 and budgeted.stats["over_tokens"] == 4
    short = judge_factory(min_score_mass=1e-9, max_input_tokens=5)
    assert short.score(batch) == [None] * 6 and short.stats["too_long"] == 6
    timed = judge_factory(min_score_mass=1e-9, time_budget_s=1e-12)
    timed.score(batch)
    assert timed.stats["over_time"] + timed.stats["judged"] == 6


def test_group_judging_shows_the_judge_the_whole_group(judge_factory):
    judge = judge_factory(group=True, min_score_mass=1e-9)
    batch = _batch()
    inputs = judge.judge_inputs(batch)
    assert "Answer 1: 4" in inputs[0] and "Answer 2: four, I think" in inputs[0] and "how good is answer 1?" in inputs[0]
    assert "how good is answer 2?" in inputs[1] and "blue" not in inputs[0]
    scores = judge.score(batch)
    assert all(s is not None and 1 <= s <= 5 for s in scores)


def test_judge_in_a_composite_reward(chat_model_dir):
    composite = CompositeReward(
        [{"module": "judge", "params": {"model": str(chat_model_dir), "min_score_mass": 1e-9}, "weight": 0.5}]
    )
    result = composite.score(_batch())
    assert all(t is not None for t in result.totals)
    assert result.totals == pytest.approx([0.5 * s for s in result.per_module["judge"]])
    composite.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"read": "logits"}, r"params.read: 'logits'; allowed: probabilities, parsed"),
        ({"rubric": "Rate {prompt}"}, r"params.rubric: must contain \{completion\}"),
        ({"rubric": "{completion} {nope}"}, r"unknown placeholder\(s\) \['nope'\]"),
        ({"group": True, "rubric": "{completion}"}, r"unknown placeholder"),
        ({"scores": [3]}, r"params.scores: at least two"),
        ({"batch_size": 0}, r"params.batch_size"),
        ({"min_score_mass": 2}, r"params.min_score_mass"),
        ({"engine": "sglang"}, r"params.engine: 'sglang'; allowed: hf, vllm"),
        ({"kv_cache_gb": 0.5}, r"params.kv_cache_gb: 0.5; allowed: a positive number of GiB with engine: vllm"),
        ({"engine": "vllm", "kv_cache_gb": 0}, r"params.kv_cache_gb: 0; allowed"),
    ],
)
def test_bad_parameters_name_their_field(params, message):
    with pytest.raises(RewardConfigError, match=message):
        JudgeReward(model="somewhere", **params)


def test_a_score_of_several_tokens_is_refused_for_the_probability_reading(chat_model_dir):
    judge = JudgeReward(model=str(chat_model_dir), scores=[1, 12345])
    with pytest.raises(RewardConfigError, match=r"params.scores: score '12345' is \d+ tokens"):
        judge.setup()


def test_more_score_tokens_than_vllm_reads_are_refused_before_it_starts(chat_model_dir):
    pytest.importorskip("vllm")
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

    many = list(range(MAX_LOGPROB_TOKEN_IDS + 1))
    judge = JudgeReward(model=str(chat_model_dir), scores=many, engine="vllm")  # setup refuses before vLLM starts
    with pytest.raises(RewardConfigError, match=rf"params.scores: {len(many)} scores; engine: vllm reads at most"):
        judge.setup()
    assert judge.engine is None


# --- a judge that scores nothing says why, naming the setting ------------------------------------


def _composite_failure(chat_model_dir, **params) -> str:
    from polyrl.rewards.base import RewardModuleError

    composite = CompositeReward([{"module": "judge", "params": {"model": str(chat_model_dir), **params}}])
    try:
        with pytest.raises(RewardModuleError) as caught:
            composite.score(_batch())
    finally:
        composite.close()
    message = str(caught.value)
    # Before, every cause read "check that the data has what it needs (e.g. references …)".
    assert "check that the data has what it needs" not in message, message
    return message


def test_a_token_budget_too_small_for_one_chunk_is_named_with_its_numbers(chat_model_dir):
    message = _composite_failure(chat_model_dir, min_score_mass=1e-9, token_budget=3, batch_size=2)
    assert "6 past judge params.token_budget (3 judge tokens per score call)" in message, message
    assert "0 were spent and the next chunk of 2 judge inputs needs" in message and "raise token_budget" in message


def test_answers_without_a_score_are_named_for_each_reading(chat_model_dir):
    # probabilities: the random judge puts far less than 0.5 on the score tokens.
    message = _composite_failure(chat_model_dir)
    assert "6 whose next-token probability on the score tokens was below params.min_score_mass (0.5" in message, message
    # parsed: no answer of the random judge starts with 1000 or 2000; the first answer is quoted.
    message = _composite_failure(chat_model_dir, read="parsed", scores=[1000, 2000], max_new_tokens=4)
    assert "6 whose answer held no allowed score (1000 or 2000)" in message and "first such answer: '" in message, message


def test_long_judge_inputs_are_named_with_the_limit(chat_model_dir):
    message = _composite_failure(chat_model_dir, min_score_mass=1e-9, max_input_tokens=5)
    assert "6 with a judge input longer than params.max_input_tokens (5; the shortest was" in message, message


def test_a_missing_model_folder_is_refused_under_the_judges_field(tmp_path):
    from polyrl.launch.preflight_rewards import reward_problems
    from polyrl.rewards.composite import RewardSpec

    missing = str(tmp_path / "no_such_judge")
    with pytest.raises(RewardConfigError) as caught:
        JudgeReward(model=missing)
    message = str(caught.value)
    assert message.startswith(f"judge params.model: {missing!r} is no folder or file that exists"), message
    assert "model.builtin.name" not in message and "unknown pretrained model" not in message
    # polyrl validate reports it under the reward's place in the list.
    (problem,) = reward_problems([RewardSpec(module="judge", params={"model": missing})])
    assert problem.startswith("rewards[0]: judge params.model:"), problem
