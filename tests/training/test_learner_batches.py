"""What enters the learner's batch and loss: dynamic sampling, samples that must not
train, per-token modalities, the critic's cadence, accuracy, the sync check, and sample tables
on resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil

import pytest
import torch
from learner_helpers import ScriptedEngine, built, completion, make_config, rollout_of
from mlflow.tracking import MlflowClient
from transformers import AutoTokenizer

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.modeling.logprobs import pack_completions
from polyrl.policies.paths import resolve_policy_path
from polyrl.policies.text import build_char_tokenizer
from polyrl.rewards.summary import accuracy_share
from polyrl.rollout.batches import LearnerBatch, Rollout, Scores
from polyrl.tracking.mlflow_runs import ExperimentTracker
from polyrl.trainer.pipeline import PipelineBatch, PipelineContext, token_discounts

# --- dynamic sampling ---------------------------------------------------------------------------

# length reward in characters: a group is informative when its texts differ in length.
INFORMATIVE, FLAT = ["ab", "abcd"], ["abc", "xyz"]


@contextlib.contextmanager
def _dynamic(tmp_path, tiny_experiment, rounds, max_rounds):
    config = tiny_experiment(
        rollout={"prompts_per_step": 3, "samples_per_prompt": 2},
        advantage={"dynamic_sampling": {"enabled": True, "max_rounds": max_rounds}},
    )
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_policy_path(make_config(config).model)))
    with built(tmp_path, config, engine=ScriptedEngine(tokenizer, rounds)) as arm:
        yield arm


def test_dynamic_sampling_keeps_only_informative_groups_and_trims_to_prompts_times_samples(tmp_path, tiny_experiment):
    rounds = [[INFORMATIVE, FLAT, FLAT], [INFORMATIVE, INFORMATIVE, INFORMATIVE]]
    with _dynamic(tmp_path, tiny_experiment, rounds, max_rounds=3) as arm:
        collected = arm.collector.collect(1)
        rollout, scores = collected.rollout, collected.scores
    # Round 1 keeps group 0 (groups 1, 2 flat); round 2 (groups 3, 4, 5) fills the 2 missing
    # groups with 3 and 4 and leaves 5 out: exactly 3 prompts × 2 samples.
    assert rollout.group_ids.tolist() == [0, 0, 3, 3, 4, 4]
    assert [c.text for c in rollout.completions] == INFORMATIVE * 3
    assert scores.totals == pytest.approx([0.02, 0.04] * 3)
    m = scores.metrics
    assert (
        m["rollout/dynamic_sampling_rounds"],
        m["rollout/dynamic_sampling_dropped_groups"],
        m["rollout/dynamic_sampling_kept_groups"],
        m["rollout/dynamic_sampling_surplus_groups"],
        m["rollout/dynamic_sampling_missing_groups"],
    ) == (2, 2, 3, 1, 0)
    # Reward metrics describe all 12 generated samples: 8 informative (0.02/0.04) and 4 flat (0.03).
    assert m["reward/mean"] == pytest.approx((4 * 0.02 + 4 * 0.04 + 4 * 0.03) / 12)


def test_dynamic_sampling_never_merges_an_uninformative_last_round(tmp_path, tiny_experiment):
    # The case: the last round keeps nothing; its flat groups used to be merged whole.
    rounds = [[INFORMATIVE, FLAT, FLAT], [FLAT, FLAT, FLAT]]
    with _dynamic(tmp_path, tiny_experiment, rounds, max_rounds=2) as arm:
        collected = arm.collector.collect(1)
        rollout, scores = collected.rollout, collected.scores
    assert rollout.group_ids.tolist() == [0, 0] and len(scores.totals) == 2
    m = scores.metrics
    assert (
        m["rollout/dynamic_sampling_rounds"],
        m["rollout/dynamic_sampling_dropped_groups"],
        m["rollout/dynamic_sampling_kept_groups"],
        m["rollout/dynamic_sampling_missing_groups"],
    ) == (2, 5, 1, 2)


def test_a_step_without_any_informative_group_makes_no_update_and_says_so(tmp_path, tiny_experiment):
    printed: list[str] = []
    with _dynamic(tmp_path, tiny_experiment, [[FLAT, FLAT, FLAT]], max_rounds=1) as arm:
        policy = arm.learner.policy
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        metrics = arm.loop(printer=printed.append).step()
        assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert metrics["train/samples"] == 0 and metrics["rollout/samples"] == 6 and "actor/loss" not in metrics
    assert any("no_informative_groups" in line for line in printed)


# --- samples that must not train -----------------------------------------------------------------


def test_a_truncated_sample_under_mask_truncated_leaves_the_loss_entirely(tmp_path, tiny_experiment):
    config = tiny_experiment(
        objective={"name": "dapo"},
        advantage={"overlong": {"mode": "mask_truncated"}},
        train={"steps": 1, "learning_rate": 1e-3, "kl_coef": 0.05, "entropy_coef": 0.01},
    )
    with built(tmp_path, config) as arm:
        learner, policy = arm.learner, arm.learner.policy
        # Group of two: the kept row is short, the truncated one long (it would dominate the
        # token-mean normaliser and its entropy/KL terms if it stayed in the loss).
        rollout = rollout_of(arm.tokenizer, [(0, "12", False), (0, "1234567890123", True)])
        both = arm.pipeline.run(rollout, Scores([1.0, 0.0], {}))
        assert both.loss_mask[1].sum() == 0 and both.loss_mask[0].sum() == 2
        assert both.advantages[0, 0] != 0  # the truncated reward still counts in the group statistics
        alone = LearnerBatch(
            packed=both.packed.select([0]),
            old_logprobs=None,
            advantages=both.advantages[[0]],
            ref_logprobs=both.ref_logprobs[[0]],
            loss_mask=both.loss_mask[[0]],
        )
        # SGD with momentum: the two updates run matmuls of different shapes (two padded rows vs
        # one), and Adam's g/√v would blow their last-bit differences up to ~lr on weights whose
        # gradient is ~0; plain gradients keep the comparison exact to fp32 rounding.
        learner.optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3, momentum=0.9)
        start = {n: p.detach().clone() for n, p in policy.named_parameters()}
        with_truncated = learner.update(both)
        after_both = {n: p.detach().clone() for n, p in policy.named_parameters()}
        policy.load_state_dict(start, strict=False)
        learner.optimizer.state.clear()
        learner.optimizer_step = 0
        only_kept = learner.update(alone)
        # A batch with nothing left to train makes no step: momentum alone would move the weights.
        before_empty = {n: p.detach().clone() for n, p in policy.named_parameters()}
        learner.update(dataclasses.replace(both, loss_mask=torch.zeros_like(both.loss_mask)))
        assert learner.optimizer_step == 1
        assert all(torch.equal(before_empty[n], p) for n, p in policy.named_parameters())
    assert with_truncated["actor/loss"] == pytest.approx(only_kept["actor/loss"], rel=1e-6, abs=1e-9)
    assert with_truncated["actor/entropy"] == pytest.approx(only_kept["actor/entropy"], rel=1e-6)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(after_both[name], p.detach(), atol=1e-7, rtol=1e-5)


def test_unscored_rewards_reach_the_estimator_as_nan_and_their_rows_leave_the_loss(tmp_path, tiny_experiment):
    with built(tmp_path, tiny_experiment(train={"steps": 1})) as arm:
        rollout = rollout_of(arm.tokenizer, [(0, "1", False), (0, "22", False), (0, "333", False), (0, "4444", False)])
        seen = {}
        context = arm.pipeline.context
        fn = context.estimator.fn

        def spy(inputs, **params):
            seen["rewards"] = inputs.rewards.clone()
            return fn(inputs, **params)

        arm.pipeline.context = dataclasses.replace(context, estimator=dataclasses.replace(context.estimator, fn=spy))
        batch = arm.pipeline.run(rollout, Scores([1.0, 0.0, None, None], {}))
    assert seen["rewards"][:2].tolist() == [1.0, 0.0] and torch.isnan(seen["rewards"][2:]).all()
    # group_norm over the scored pair: mean 0.5, unbiased std 0.7071 → ±0.7071.
    assert batch.advantages[0, 0] == pytest.approx(0.7071, abs=1e-3) and batch.advantages[1, 0] == pytest.approx(
        -0.7071, abs=1e-3
    )
    assert batch.loss_mask[2:].sum() == 0 and torch.count_nonzero(batch.advantages[2:]) == 0
    assert batch.metrics["reward/unscored_samples"] == 2


# --- per-token modalities -------------------------------------------------------------------------


def test_an_image_marked_completion_token_gets_the_image_gamma_and_lambda(tmp_path, tiny_experiment):
    # The stage alone: it reads only the modality settings.
    context = PipelineContext(
        estimator=None, estimator_params={}, pad_token_id=0, modalities=make_config(tiny_experiment()).modalities
    )
    tokenizer = build_char_tokenizer()
    marked = completion(tokenizer, "draw:", "a#b", modalities=("text", "image", "text"))
    plain = completion(tokenizer, "draw:", "ab")
    assert plain.completion_token_modalities == ("text", "text")
    rollout = Rollout([None, None], [marked, plain], torch.tensor([0, 0]))
    stage = token_discounts(
        PipelineBatch(rollout, Scores([None, None], {}), packed=pack_completions([marked, plain], pad_token_id=0)), context
    )
    gammas, lambdas = stage.gammas, stage.lambdas
    assert gammas[0].tolist() == pytest.approx([0.95, 0.85, 0.95]) and lambdas[0].tolist() == pytest.approx([0.9, 0.8, 0.9])
    assert gammas[1, :2].tolist() == pytest.approx([0.95, 0.95])


# --- critic ---------------------------------------------------------------------------------------


def test_the_critic_cadence_counts_optimizer_steps_across_a_resume_and_uses_train_value_settings(tmp_path, tiny_experiment):
    # 2 mini-batches per step = 2 optimizer steps; a critic update every 4th: optimizer steps
    # 1 and 5, i.e. steps 1 and 3 (a count by training step would give steps 1 and 4).
    value = {"learning_rate": 1e-3, "update_every": 4, "betas": [0.8, 0.9], "weight_decay": 0.01, "max_grad_norm": 0.5}
    config = tiny_experiment(
        objective={"name": "ppo"},
        train={"steps": 4, "learning_rate": 1e-3, "mini_batches": 2, "value": value},
        checkpoint={"every": 2},
    )
    with built(tmp_path, config) as arm:
        group = arm.critic.optimizer.param_groups[0]
        assert (group["lr"], group["betas"], group["weight_decay"]) == (1e-3, (0.8, 0.9), 0.01)
        loop = arm.loop()
        first = [loop.step() for _ in range(2)]
    with built(tmp_path, config, resume=True) as resumed:
        assert resumed.learner.optimizer_step == 4
        loop = resumed.loop()
        later = [loop.step() for _ in range(2)]
    assert [h["value/updates"] for h in first + later] == [1.0, 0.0, 1.0, 0.0]
    assert all(math.isfinite(h["value/loss"]) and h["value/grad_norm"] >= 0 for h in (first[0], later[0]))


def test_value_coef_is_refused_as_an_unknown_field():
    with pytest.raises(ConfigError, match=r"train\.value\.coef: unknown field"):
        resolve_arms({"name": "x", "train": {"value": {"coef": 0.5}}})


# --- accuracy ------------------------------------------------------------------------------------


def test_train_accuracy_comes_from_the_reward_the_yaml_names(tmp_path, tiny_experiment):
    rewards = [{"module": "length", "name": "verifier", "params": {"unit": "chars"}}]
    with built(tmp_path, tiny_experiment(rewards=rewards, tracking={"accuracy_reward": "verifier"})) as named:
        rollout = rollout_of(named.tokenizer, [(0, "abc", False), (0, "", False), (0, "ab", False), (0, "", False)])
        scores = named.collector.score(rollout)
    # len/100 = 0.03, 0, 0.02, 0 → 2 of 4 are > 0: accuracy 0.5 (the eval harness's function).
    assert scores.per_module["verifier"] == pytest.approx([0.03, 0.0, 0.02, 0.0])
    assert scores.metrics["train/accuracy"] == 0.5 == accuracy_share(scores.per_module["verifier"])
    with built(tmp_path, tiny_experiment(rewards=rewards)) as unnamed:
        assert "train/accuracy" not in unnamed.collector.score(rollout).metrics
    with pytest.raises(
        ConfigError, match=r"tracking\.accuracy_reward: no reward is labelled 'accuracy'; reward labels: verifier"
    ):
        with built(tmp_path, tiny_experiment(rewards=rewards, tracking={"accuracy_reward": "accuracy"})):
            pass


def test_rollout_lengths_are_also_logged_for_the_right_and_the_wrong_samples(tmp_path, tiny_experiment):
    # The verifier is the length reward (len/100 > 0 is "right"): "" is wrong, the rest right.
    # One token per character: right "abc", "a", "abcdefgh" → (3 + 1 + 8) / 3 = 4.0; wrong: "", "" → 0.0.
    rewards = [{"module": "length", "name": "verifier", "params": {"unit": "chars"}}]
    config = tiny_experiment(
        rewards=rewards, tracking={"accuracy_reward": "verifier"}, rollout={"prompts_per_step": 2, "samples_per_prompt": 3}
    )
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_policy_path(make_config(config).model)))
    with built(tmp_path, config, engine=ScriptedEngine(tokenizer, [[["abc", "", "a"], ["", "abcdefgh", ""]]])) as arm:
        metrics = arm.collector.collect(1).scores.metrics
    assert metrics["train/accuracy"] == 0.5
    assert metrics["rollout/response_length/correct_mean"] == pytest.approx(4.0)
    assert metrics["rollout/response_length/wrong_mean"] == 0.0


def test_accuracy_is_the_share_of_scored_samples_above_zero():
    # 1 and 2 count, 0 and -1 do not, None is left out: 2 of 4.
    assert accuracy_share([1.0, 0.0, None, 2.0, -1.0]) == 0.5
    assert math.isnan(accuracy_share([None, None]))


# --- the sync check ------------------------------------------------------------------------------


def test_a_stale_weight_sync_trips_the_logprob_gap_check(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 2, "learning_rate": 3e-2})
    outcomes = {}
    for stale in (False, True):
        printed: list[str] = []
        with built(tmp_path / str(stale), config) as arm:
            if stale:
                arm.collector.engine.sync_weights = lambda named_tensors: None
            history = arm.loop(printer=printed.append).run()
        outcomes[stale] = ([h["rollout/logprob_gap"] for h in history], [line for line in printed if "logprob_gap" in line])
    gaps, warnings = outcomes[False]
    assert max(gaps) < 1e-3 and warnings == []
    gaps, warnings = outcomes[True]
    assert gaps[0] < 1e-3 and gaps[1] > 1e-2
    assert len(warnings) == 1 and "step 2" in warnings[0] and "stale or partial weight sync" in warnings[0]


# --- sample tables on resume ---------------------------------------------------------------------


def test_steps_recomputed_after_a_resume_do_not_append_to_logged_sample_tables(tmp_path, tiny_experiment):
    config = tiny_experiment(
        train={"steps": 2}, tracking={"sample_table_every": 1, "sample_table_rows": 4}, checkpoint={"every": 1, "keep": 5}
    )
    tracker = ExperimentTracker(config["tracking"]["uri"], "tiny")
    parent = tracker.start_parent("tiny")
    logger = tracker.start_arm(parent.run_id, "main")
    with built(tmp_path, config, logger=logger) as arm:
        arm.loop().run()
    # A kill after step 2 was logged but before its checkpoint: resume recomputes step 2.
    shutil.rmtree(tmp_path / "runs" / "main" / "step_000002")
    again = tracker.start_arm(parent.run_id, "main", resume_run_id=logger.run_id)
    with built(tmp_path, config, logger=again, resume=True) as resumed:
        loop = resumed.loop()
        assert loop.step_index == 1
        loop.run()
    client = MlflowClient(config["tracking"]["uri"])
    path = client.download_artifacts(logger.run_id, "samples/step_00002.json", str(tmp_path / "download"))
    with open(path) as handle:
        assert len(json.load(handle)["data"]) == 4
    assert [m.step for m in client.get_metric_history(logger.run_id, "actor/loss")] == [1, 2]


def test_under_dynamic_sampling_rollout_lengths_cover_every_generated_sample_and_train_lengths_the_kept_ones(
    tmp_path, tiny_experiment
):
    # One token per character (the tiny policy's tokenizer). Round 1: INFORMATIVE (2, 4) and two
    # flat groups of 8-token answers; round 2: three INFORMATIVE groups. Kept: the 3 informative
    # groups of rounds 1-2 → (2 + 4) × 3 / 6 = 3.0. Generated: (2 + 4 + 8 × 4) + (2 + 4) × 3 = 56 over 12 = 4.667.
    long_flat = ["abcdefgh", "hgfedcba"]
    rounds = [[INFORMATIVE, long_flat, long_flat], [INFORMATIVE, INFORMATIVE, INFORMATIVE]]
    with _dynamic(tmp_path, tiny_experiment, rounds, max_rounds=3) as arm:
        metrics = arm.loop(printer=lambda line: None).step()
    assert metrics["rollout/response_length/mean"] == pytest.approx(56 / 12) and metrics["rollout/samples"] == 12
    assert metrics["rollout/response_length/max"] == 8
    assert metrics["train/response_length/mean"] == pytest.approx(3.0) and metrics["train/samples"] == 6
    # The length health check reads the generated samples' mean (its first value is that step's).
    assert arm.health._first_length == pytest.approx(56 / 12)
