"""Episodes on a real engine: the policy's ids are never re-tokenised, observation tokens get no
gradient and no length, and the learner scores exactly what the sampler sampled."""

from __future__ import annotations

import pytest
import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.envs.builtins.guess_number import GuessNumberEnv
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs
from polyrl.modeling.microbatches import trim_padding
from polyrl.rollout.batches import Rollout, Scores, length_metrics
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings, episode_metrics


class Recording:
    """The real engine, with every request's prompt ids and every sampled id list kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, settings):
        out = self.engine.generate(prompts, settings)
        self.calls += [(list(p.prompt_ids), list(g[0].completion_ids)) for p, g in zip(prompts, out)]
        return out


@pytest.fixture(scope="module")
def played(tiny_arch_dir):
    from polyrl.engines.hf_engine import HFRolloutEngine

    path = tiny_arch_dir("qwen2")
    engine = Recording(HFRolloutEngine(str(path), seed=0))
    runner = EpisodeRunner(GuessNumberEnv, engine.engine.tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=200))
    prompts = [
        PromptSample("Guess a number from 1 to 10.", fields={"target": 4}),
        PromptSample("Guess again.", fields={"target": 7}),
    ]
    # The random model never writes its end-of-turn token; the stop string "e" ends its turns early.
    groups = runner.run(engine, prompts, SamplingSettings(n=2, max_tokens=10, seed=0, stop=["e"]))
    return path, engine, [c for g in groups for c in g]


def test_policy_ids_are_kept_as_sampled(played):
    _, engine, completions = played
    assert len(completions) == 4
    assert any(0 in c.completion_mask for c in completions), "no episode got an observation"
    for c in completions:
        full = c.prompt_ids + c.completion_ids
        trained = {i for i, m in enumerate(c.completion_mask) if m}
        found = set()
        for request, sampled in engine.calls:
            n = len(request)
            if full[:n] == request and full[n : n + len(sampled)] == sampled:
                found |= set(range(n - len(c.prompt_ids), n - len(c.prompt_ids) + len(sampled)))
        # Every trained position holds a sampled id at the place it was sampled, and every
        # sampled turn of the episode is there unchanged (no budget cut in this episode set).
        assert found == trained
        assert len(c.sampling_logprobs) == len(c.completion_ids)
        assert all(lp == 0.0 for lp, m in zip(c.sampling_logprobs, c.completion_mask) if not m)


def test_learner_scores_the_same_ids_and_masked_tokens_get_zero_gradient(played):
    from transformers import AutoModelForCausalLM

    from polyrl.algos.objectives import get_objective

    path, _, completions = played
    packed = pack_completions(completions, pad_token_id=0)
    for row, c in enumerate(completions):
        n = len(c.prompt_ids) + len(c.completion_ids)
        assert packed.input_ids[row, :n].tolist() == c.prompt_ids + c.completion_ids
        assert packed.response_mask[row, : len(c.completion_ids)].tolist() == list(c.completion_mask)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    logprobs, _ = token_logprobs(model, packed)
    logprobs.retain_grad()
    mask = packed.response_mask.bool()
    # Same ids at the same positions: the learner's log-probs equal the sampler's on policy tokens.
    assert logprob_gap(packed.sampling_logprobs, logprobs.detach(), mask) < 1e-4
    loss, _ = get_objective("grpo").fn(
        logprobs, logprobs.detach(), torch.ones_like(logprobs), mask, loss_normalizer=float(mask.sum()), aggregation="token_mean"
    )
    loss.backward()
    observation = torch.zeros_like(mask)
    for row, c in enumerate(completions):
        observation[row, : len(c.completion_mask)] = torch.tensor([m == 0 for m in c.completion_mask])
    assert observation.any()
    assert torch.all(logprobs.grad[observation] == 0)
    # token_mean with A = 1 and ratio 1: d loss / d logprob = -1 / (policy tokens) on each policy token.
    assert torch.allclose(logprobs.grad[mask], torch.full_like(logprobs.grad[mask], -1.0 / float(mask.sum())))


def test_lengths_and_metrics_count_policy_tokens_only(played):
    _, _, completions = played
    metrics = length_metrics(completions, "rollout")
    policy = [sum(c.completion_mask) for c in completions]
    assert metrics["rollout/response_length/mean"] == pytest.approx(sum(policy) / len(policy))
    episode = episode_metrics(completions)
    assert episode["episode/policy_tokens_mean"] == pytest.approx(sum(policy) / len(policy))
    assert 1.0 <= episode["episode/turns_mean"] <= 3.0
    assert episode["episode/observation_tokens_mean"] > 0


def test_trim_padding_keeps_the_last_policy_token_after_observations():
    # mask 1,0,0,1: the mask sums to 2 but the row is 4 wide; trimming to 2 columns would drop
    # the last policy token from the loss.
    c = Completion([5, 6], [1, 2, 3, 4], "x", [-0.1, 0.0, 0.0, -0.2], "stop", completion_mask=(1, 0, 0, 1))
    packed = trim_padding(pack_completions([c], pad_token_id=0))
    assert packed.response_mask.tolist() == [[1, 0, 0, 1]]
    assert packed.completion_ids.tolist() == [[1, 2, 3, 4]]


@pytest.mark.parametrize("layout", ["share_prompts", "padding_free"])
def test_packed_layouts_score_episodes_as_the_plain_forward(played, layout):
    # Shared-prompt packing read a row's completion length as its mask's sum: an episode's
    # observation tokens (mask 0, inside the completion) would have cut its tail off.
    from transformers import AutoModelForCausalLM

    path, _, completions = played
    packed = pack_completions(completions, pad_token_id=0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    mask = packed.response_mask.bool()
    with torch.no_grad():
        plain, _ = token_logprobs(model, packed)
        other, _ = token_logprobs(model, packed, **{layout: True})
    assert torch.allclose(plain[mask], other[mask], atol=1e-5)


def test_kl_in_reward_puts_the_episode_reward_on_its_last_policy_token():
    # mask 1,1,0,0,1,0 (an episode ending on an observation): the mask sums to 3, but the last
    # policy token is at index 4; the old rule (sum - 1 = 2) put the reward on an observation token.
    from polyrl.trainer.pipeline import PipelineBatch, PipelineContext, fold_kl_into_rewards

    c = Completion([7], [1, 2, 3, 4, 5, 6], "x", [-0.1] * 6, "length", completion_mask=(1, 1, 0, 0, 1, 0))
    packed = pack_completions([c], pad_token_id=0)
    zeros = torch.zeros(1, 6)
    batch = PipelineBatch(
        Rollout([PromptSample("p")], [c], torch.tensor([0])),
        Scores([2.0], {}),
        packed=packed,
        rewards=torch.tensor([2.0]),
        old_logprobs=zeros,
        ref_logprobs=zeros,
    )
    ctx = PipelineContext(estimator=None, estimator_params={}, pad_token_id=0, kl_in_reward=True, kl_coef=0.1)
    shaped = fold_kl_into_rewards(batch, ctx).token_rewards
    # KL is 0 (same log-probs), so the shaped rewards are the placed reward alone.
    assert shaped.tolist() == [[0.0, 0.0, 0.0, 0.0, 2.0, 0.0]]
