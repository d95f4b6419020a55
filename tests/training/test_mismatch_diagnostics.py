"""The sampler/learner mismatch diagnostics in the learner and the pipeline, the rollout correction's
two modes, the health warning, and the asynchronous-run checks (a sync check on the
rows sampled at the learner's weights; a bf16 sampler under max_staleness refused without a correction)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.algos.rollout_correction import CorrectionSettings, mismatch_diagnostics
from polyrl.config.schema import ExperimentConfig, resolve_arms
from polyrl.core.errors import PolyrlError
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.monitoring.health import HealthMonitor
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch, Scores
from polyrl.trainer.pipeline import PipelineBatch, PipelineContext, rollout_correction

ROWS = [([5, 6], [7, 8, 9]), ([5, 6], [10, 11]), ([12], [7]), ([12], [8, 9, 10])]


def _policy():
    return build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)


def _learner(policy, **settings) -> PolicyLearner:
    objective = get_objective("grpo")
    defaults = dict(
        aggregation=objective.default_aggregation,
        objective_params=dict(objective.default_params),
        learning_rate=1e-2,
        micro_batch_size=2,
    )
    return PolicyLearner(policy, objective, LearnerSettings(**{**defaults, **settings}))


def _batch(policy, *, shift: float, versions=None, behaviour: bool = False) -> LearnerBatch:
    """Sampler log-probs = the policy's own + ``shift`` per token (a known mismatch)."""
    completions = [
        Completion(
            prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[0.0] * len(c), finish_reason="stop", policy_version=v
        )
        for (p, c), v in zip(ROWS, versions or [None] * len(ROWS))
    ]
    packed = pack_completions(completions, pad_token_id=0)
    with torch.no_grad():
        learner_lp, _ = token_logprobs(policy, packed)
    mask = packed.response_mask.bool()
    packed = dataclasses.replace(packed, sampling_logprobs=torch.where(mask, learner_lp + shift, torch.zeros_like(learner_lp)))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * packed.response_mask
    old = packed.sampling_logprobs.clone() if behaviour else None
    versions_t = torch.tensor([-1 if v is None else v for v in (versions or [None] * len(ROWS))])
    return LearnerBatch(packed=packed, old_logprobs=old, advantages=advantages, policy_versions=versions_t)


def test_the_learner_logs_the_mismatch_of_its_first_forward():
    policy = _policy()
    batch = _batch(policy, shift=0.1)
    metrics = _learner(policy).update(batch)
    # log r = learner − sampler = −0.1 on every token: k1 = 0.1, k3 = e^-0.1 − 1 + 0.1 = 0.0048374, |gap| = 0.1
    assert metrics["rollout_corr/kl"] == pytest.approx(0.1, abs=1e-5)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(0.0048374, rel=1e-3)
    assert metrics["rollout/logprob_gap"] == pytest.approx(0.1, abs=1e-5)
    assert metrics["rollout_corr/log_ppl_diff"] == pytest.approx(0.1, abs=1e-5)
    assert metrics["rollout_corr/compared_tokens"] == 9  # 3 + 2 + 1 + 3 response tokens


def test_async_batches_keep_a_sync_check_on_the_rows_sampled_at_the_learners_weights():
    """Before, with π_old the sampler's (max_staleness ≥ 1) there was no sampler/learner check at all."""
    policy = _policy()
    # Rows 0 and 2 sampled at version 3 (the learner's, as the asynchronous loop numbers it), rows 1 and 3 one older.
    batch = _batch(policy, shift=0.1, versions=[3, 2, 3, 2], behaviour=True)
    metrics = _learner(policy).update(batch, step_index=3, weight_version=3)
    assert metrics["rollout_corr/compared_tokens"] == 4  # rows 0 and 2: 3 + 1 tokens
    assert metrics["rollout/logprob_gap"] == pytest.approx(0.1, abs=1e-5)
    assert (metrics["rollout_corr/rows_measured"], metrics["rollout_corr/rows_older_weights"]) == (2, 2)
    # No row at the learner's weights: nothing compared, no gap reported (rather than a wrong one), and why.
    older = _batch(policy, shift=0.1, versions=[2, 2, 2, 2], behaviour=True)
    metrics = _learner(_policy()).update(older, step_index=3, weight_version=3)
    assert "rollout/logprob_gap" not in metrics
    assert (metrics["rollout_corr/rows_measured"], metrics["rollout_corr/rows_older_weights"]) == (0, 4)


def test_the_learner_measures_the_rows_of_its_own_weight_version_whatever_the_step():
    """The learner's weight version counts the updates that moved its weights; the synchronous
    loop's syncs give the engine that number. Compared with the step index instead, the check went
    dark for good after a resume or a step without an update (the engine's count fell behind)."""
    policy = _policy()
    learner = _learner(policy)
    assert learner.weight_version == 0
    first = learner.update(_batch(policy, shift=0.1, versions=[0] * 4), step_index=0)
    assert first["rollout/logprob_gap"] == pytest.approx(0.1, abs=1e-5) and learner.weight_version == 1
    # Three steps later (steps without an update between): the rows of version 1 are the learner's.
    later = learner.update(_batch(policy, shift=0.2, versions=[1] * 4), step_index=4)
    assert later["rollout/logprob_gap"] == pytest.approx(0.2, abs=1e-5) and later["rollout_corr/rows_measured"] == 4
    # Rows the engine stamped with an older version: not the learner's weights, counted, not compared.
    stale = learner.update(_batch(policy, shift=0.1, versions=[1] * 4), step_index=5)
    assert "rollout/logprob_gap" not in stale and stale["rollout_corr/rows_older_weights"] == 4
    # ... and a version the learner never had (a sync it did not count): counted apart.
    ahead = learner.update(_batch(policy, shift=0.1, versions=[9] * 4), step_index=6)
    assert ahead["rollout_corr/rows_other_version"] == 4 and ahead["rollout_corr/rows_measured"] == 0


def test_an_update_that_applies_no_optimizer_step_keeps_the_weight_version():
    policy = _policy()
    learner = _learner(policy)
    batch = _batch(policy, shift=0.1, versions=[0] * 4)
    # A NaN advantage: the loss is NaN, the guard skips the optimizer step (learner/nonfinite.py).
    skipped = dataclasses.replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
    metrics = learner.update(skipped)
    assert metrics["health/nonfinite_steps"] == 1
    assert learner.optimizer_step == 0 and learner.weight_version == 0
    assert metrics["rollout/logprob_gap"] == pytest.approx(0.1, abs=1e-5)  # the same weights sampled it


def test_the_weight_version_is_checkpointed_and_derived_for_older_checkpoints():
    learner = _learner(_policy(), mini_batches=2)
    learner.load_state_dict({**learner.state_dict(), "optimizer_step": 6, "weight_version": 2})
    assert learner.state_dict()["weight_version"] == 2
    learner.load_state_dict({"optimizer_step": 6})  # before weight versions: one per step's 2 optimizer steps
    assert learner.weight_version == 3


def test_bypass_masks_apply_in_the_update_with_the_current_policy():
    policy = _policy()
    # Row 0 sampled far off (shift 1 nat per token), the rest on policy.
    batch = _batch(policy, shift=0.0, behaviour=True)
    sampled = batch.packed.sampling_logprobs.clone()
    sampled[0] += batch.packed.response_mask[0] * 1.0
    packed = dataclasses.replace(batch.packed, sampling_logprobs=sampled)
    bypass = dataclasses.replace(
        batch, packed=packed, old_logprobs=sampled.clone(), in_update_correction=CorrectionSettings(geometric=(0.9, 1.1))
    )
    # seq_sum_constant_norm: the normaliser counts every row, so masking by hand changes nothing else.
    metrics = _learner(policy, aggregation="seq_sum_constant_norm", max_tokens=3).update(bypass)
    # Row 0's geometric-mean ratio e^-1 = 0.37 leaves [0.9, 1.1]: its 3 tokens of 9 masked.
    assert metrics["rollout_corr/geo_masked_token_fraction"] == pytest.approx(3 / 9, abs=1e-6)
    # The same update as a batch whose loss mask drops row 0 by hand.
    by_hand_policy = _policy()
    mask = bypass.loss_mask.clone()
    mask[0] = False
    by_hand = dataclasses.replace(bypass, in_update_correction=None, loss_mask=mask)
    _learner(by_hand_policy, aggregation="seq_sum_constant_norm", max_tokens=3).update(by_hand)
    for (name, p), q in zip(policy.named_parameters(), by_hand_policy.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def _pipeline_batch(old: torch.Tensor, sampled: torch.Tensor, advantages: torch.Tensor) -> PipelineBatch:
    completions = [
        Completion(prompt_ids=[1], completion_ids=[5, 6], text="", sampling_logprobs=s.tolist(), finish_reason="stop")
        for s in sampled
    ]
    packed = pack_completions(completions, pad_token_id=0)
    from polyrl.rollout.batches import Rollout

    rollout = Rollout([None] * len(completions), completions, torch.zeros(len(completions), dtype=torch.long))
    return PipelineBatch(
        rollout, Scores([1.0] * len(completions), {}), packed=packed, old_logprobs=old, advantages=advantages,
        loss_mask=packed.response_mask.bool(),
    )  # fmt: skip


def _ctx(correction) -> PipelineContext:
    return PipelineContext(estimator=None, estimator_params={}, pad_token_id=0, rollout_correction=correction)


def test_decoupled_correction_weights_advantages_and_masks_tokens_in_the_pipeline():
    cfg = ExperimentConfig(name="t", objective={"rollout_correction": {"is_level": "token", "icepop": {"low": 0.5, "high": 1.5}}})
    old = torch.tensor([[-1.0, -1.0], [-1.0, -3.0]])
    sampled = torch.tensor([[-1.2, -1.0], [-1.0, -1.0]])
    b = rollout_correction(_pipeline_batch(old, sampled, torch.full((2, 2), 2.0)), _ctx(cfg.objective.rollout_correction))
    # ratios: e^0.2 = 1.2214, 1; 1, e^-2 = 0.135 (ICEPOP drops it, < 0.5)
    assert b.loss_mask.tolist() == [[True, True], [True, False]]
    torch.testing.assert_close(b.advantages, torch.tensor([[2 * 1.221403, 2.0], [2.0, 0.0]]))
    assert b.metrics["rollout_corr/masked_token_fraction"] == pytest.approx(0.25)
    # Without a correction the shares are logged as 0 (always-on diagnostics).
    plain = rollout_correction(_pipeline_batch(old, sampled, torch.ones(2, 2)), _ctx(None))
    assert plain.metrics["rollout_corr/masked_token_fraction"] == 0.0


def test_the_pipeline_diagnostics_match_the_module():
    old = torch.tensor([[-1.0, -2.0]])
    sampled = torch.tensor([[-1.5, -2.0]])
    m = mismatch_diagnostics(old, sampled, torch.ones(1, 2, dtype=torch.bool))
    assert m["rollout_corr/kl"] == pytest.approx(-0.25)  # mean(−(0.5, 0))


def _health(**overrides) -> HealthMonitor:
    return HealthMonitor(ExperimentConfig(name="t", health=overrides).health)


def test_health_warns_on_a_large_or_growing_mismatch():
    monitor = _health(max_mismatch_kl=1e-3, mismatch_growth=10)
    for kl in (2e-5, 2e-5, 2e-5, 1e-4):  # baseline 2e-5; 1e-4 is 5x: no warning
        assert monitor.check(1, {"rollout_corr/k3_kl": kl}) == []
    warnings = monitor.check(5, {"rollout_corr/k3_kl": 3e-4})  # 15x the baseline
    assert len(warnings) == 1 and warnings[0].startswith("mismatch_growth:")
    warnings = monitor.check(6, {"rollout_corr/k3_kl": 2e-3})
    assert any(w.startswith("mismatch_kl:") for w in warnings)
    # fp32 rounding noise grows by large factors without meaning anything: below 1e-5 no warning
    quiet = _health()
    for kl in (1e-12, 1e-12, 1e-12, 1e-9):
        assert quiet.check(1, {"rollout_corr/k3_kl": kl}) == []


def test_health_says_once_why_a_step_measured_no_mismatch():
    stale = {"rollout_corr/rows_measured": 0.0, "rollout_corr/rows_older_weights": 16.0, "rollout_corr/rows_other_version": 0.0}
    monitor = _health()
    warnings = monitor.check(2, dict(stale))
    assert len(warnings) == 1 and warnings[0].startswith("mismatch_unmeasured:") and "older weights" in warnings[0]
    assert monitor.check(3, dict(stale)) == []  # said once, counted after
    assert monitor.fired["mismatch_unmeasured"] == 2
    ahead = {**stale, "rollout_corr/rows_older_weights": 0.0, "rollout_corr/rows_other_version": 16.0}
    warnings = _health().check(2, ahead)
    assert len(warnings) == 1 and "weight sync" in warnings[0]
    # Measured (or measured by the pipeline, which logs no rows_*): nothing to say.
    assert _health().check(2, {**stale, "rollout_corr/rows_measured": 4.0, "rollout/logprob_gap": 1e-7}) == []
    assert _health().check(2, {"rollout/logprob_gap": 1e-7}) == []


def test_a_bf16_sampler_under_staleness_without_a_correction_is_refused():
    """Without a correction the sampler's rounding would enter every ratio (GSPO's 3e-4 band)."""
    raw = {"name": "t", "rollout": {"max_staleness": 1, "dtype": "bfloat16"}}
    with pytest.raises(PolyrlError, match=r"rollout\.dtype: the sampler runs in bfloat16.*rollout_correction"):
        resolve_arms(raw)
    corrected = {**raw, "objective": {"rollout_correction": {"mode": "decoupled", "is_level": "token"}}}
    assert resolve_arms(corrected)["main"].objective.rollout_correction.is_level == "token"
    assert resolve_arms({**raw, "rollout": {"max_staleness": 1}})  # same dtype: fine


@pytest.mark.parametrize(
    "correction, field",
    [
        ({"mode": "bypass", "is_level": "token"}, "objective.rollout_correction"),
        ({"is_threshold": 3.0}, "objective.rollout_correction"),
        ({"icepop": {"low": 1.2, "high": 2.0}}, "objective.rollout_correction.icepop.low"),
    ],
)
def test_settings_that_would_do_nothing_are_refused(correction, field):
    with pytest.raises(PolyrlError, match=field):
        resolve_arms({"name": "t", "objective": {"rollout_correction": correction}})


def test_token_tis_twice_is_refused():
    raw = {
        "name": "t",
        "rollout": {"truncated_importance_sampling": {"enabled": True}},
        "objective": {"rollout_correction": {"is_level": "token"}},
    }
    with pytest.raises(PolyrlError, match="truncated_importance_sampling.enabled"):
        resolve_arms(raw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "correction",
    [
        None,
        {"mode": "decoupled", "is_level": "sequence", "is_threshold": 3.0, "geometric": {"low": 0.5, "high": 2.0}},
        {"mode": "bypass", "icepop": {"low": 0.5, "high": 2.0}, "opsm_threshold": 0.5},
    ],
    ids=["none", "decoupled", "bypass"],
)
def test_every_run_logs_the_mismatch_and_corrected_runs_train(tmp_path, tiny_experiment, correction):
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8, "mini_batches": 2})
    if correction is not None:
        raw["objective"] = {"rollout_correction": correction}
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        before = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters()}
        history = arm.loop().run()
    finally:
        arm.close()
    for metrics in history:
        for key in ("rollout/logprob_gap", "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff",
                    "rollout_corr/masked_token_fraction", "rollout_corr/masked_seq_fraction"):  # fmt: skip
            assert key in metrics and metrics[key] == metrics[key], key
        # The HF engine samples with the learner's weights in fp32: the mismatch is rounding.
        assert metrics["rollout_corr/k3_kl"] < 1e-6
    assert any(not torch.equal(before[n], p) for n, p in arm.learner.policy.named_parameters())
    if correction is not None and correction["mode"] == "decoupled":
        assert "rollout_corr/is_weight_mean" in history[-1] and "rollout_corr/geo_masked_token_fraction" in history[-1]
    if correction is not None and correction["mode"] == "bypass":
        assert "rollout_corr/icepop_masked_token_fraction" in history[-1]


@pytest.mark.slow
def test_an_asynchronous_run_keeps_its_sync_check(tmp_path, tiny_experiment):
    """Before, with max_staleness 1 the gap was neither computed nor checked."""
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(rollout={"max_staleness": 1}, train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8})
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        assert arm.health.check_logprob_gap
        history = arm.loop().run()
    finally:
        arm.close()
    checked = [m for m in history if "rollout/logprob_gap" in m]
    # Step 1 always trains on version-0 samples (staleness 0); later steps on the rows still at staleness 0.
    assert checked and all(m["rollout/logprob_gap"] < 1e-3 for m in checked)
    assert all(0 < m["rollout_corr/compared_tokens"] for m in checked)
