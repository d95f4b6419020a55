"""The data-parallel learner (train.learner_workers): 2 learner ranks as Ray actors on a real local
Ray cluster, joined in a real gloo process group, against one process on the whole batch."""

from __future__ import annotations

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.core.types import Completion
from polyrl.engines.image_prompts import auto_model_class
from polyrl.learner.critic import Critic, CriticSettings, ValueModel
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.learner.ranks import DataParallelLearner, LearnerRanks, RankRecipe
from polyrl.modeling.logprobs import pack_completions
from polyrl.rollout.batches import LearnerBatch

# Rows of different lengths (prompt ids, completion ids); one row has no completion tokens.
ROWS = [
    ([5, 6], [7, 8, 9, 10]),
    ([5, 6], [10, 11]),
    ([12], [7]),
    ([12], [8, 9, 10, 11, 12, 13]),
    ([14, 15, 16], [17, 18, 19]),
    ([14, 15, 16], [20]),
    ([9], [21, 22, 23, 24, 25]),
    ([9], []),
]


@pytest.fixture(scope="module")
def ranks(ray_local):
    group = LearnerRanks(2, timeout_s=60)
    yield group
    group.call("leave")
    group.close()


def _batch(policy_dir, *, critic: Critic | None = None) -> LearnerBatch:
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in ROWS
    ]
    packed = pack_completions(completions, pad_token_id=0)
    generator = torch.Generator().manual_seed(0)
    mask = packed.response_mask
    advantages = torch.randn(mask.shape, generator=generator) * mask
    old = (torch.randn(mask.shape, generator=generator) * 0.1 - 3.0) * mask if critic is not None else None
    extra = {}
    if critic is not None:
        old_values = critic.values(packed)
        extra = dict(old_values=old_values, returns=(old_values + advantages).detach())
    return LearnerBatch(packed=packed, old_logprobs=old, advantages=advantages, **extra)


def _learner(policy_dir, objective: str, settings: dict, *, critic: CriticSettings | None = None) -> PolicyLearner:
    policy = auto_model_class(policy_dir).from_pretrained(str(policy_dir), dtype=torch.float32)
    spec = get_objective(objective)
    learner_settings = LearnerSettings(
        **{
            "aggregation": spec.default_aggregation,
            "objective_params": dict(spec.default_params),
            "learning_rate": 1e-4,
            "micro_batch_size": 2,
            "total_steps": 2,
            **settings,
        }
    )
    torch.manual_seed(1)  # the value head's random start (the ranks get the mirror's)
    value = Critic(ValueModel(policy_dir, torch.float32), critic) if critic is not None else None
    return PolicyLearner(policy, spec, learner_settings, critic=value)


def _params(learner) -> dict[str, torch.Tensor]:
    out = {f"policy.{n}": p.detach().clone() for n, p in learner.policy.named_parameters()}
    if learner.critic is not None:
        out.update({f"critic.{n}": p.detach().clone() for n, p in learner.critic.model.named_parameters()})
    return out


def _worst_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of ‖a − b‖ / ‖a‖."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-12)) for k in a)


def _first_moments(learner) -> dict[str, torch.Tensor]:
    moments = {f"policy.{k}": v["exp_avg"] for k, v in learner.optimizer.state_dict()["state"].items()}
    if learner.critic is not None:
        moments.update({f"critic.{k}": v["exp_avg"] for k, v in learner.critic.optimizer.state_dict()["state"].items()})
    return moments


def _data_parallel(ranks, policy_dir, objective, settings, critic=None) -> DataParallelLearner:
    mirror = _learner(policy_dir, objective, settings, critic=critic)
    recipe = RankRecipe(policy_path=str(policy_dir), objective=objective, settings=mirror.settings, critic=critic)
    return DataParallelLearner(mirror, ranks, recipe)


CASES = {
    # token level: DAPO's token_mean over the batch's tokens, two mini-batches (two optimizer steps)
    "dapo_token_mean": ("dapo", {"mini_batches": 2}, None),
    # sequence level: GSPO's sequence ratio with seq_mean_token_mean
    "gspo_seq_mean": ("gspo", {}, None),
    # Dr.GRPO's constant normaliser (sequences × L_max)
    "dr_grpo_constant": ("dr_grpo", {"max_tokens": 8}, None),
    # PPO with the critic (clipped value loss, token_mean), on sampler log-probs as π_old
    "ppo_critic": ("ppo", {}, CriticSettings(learning_rate=1e-4, micro_batch_size=2)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_take_the_single_process_step_on_the_whole_batch(ranks, random_policy_dir, case):
    objective, settings, critic = CASES[case]
    single = _learner(random_policy_dir, objective, settings, critic=critic)
    start = _params(single)
    batch = _batch(random_policy_dir, critic=single.critic)
    single_metrics = single.update(batch, step_index=0)

    parallel = _data_parallel(ranks, random_policy_dir, objective, settings, critic=critic)
    assert _worst_relative_difference(start, _params(parallel)) == 0.0  # same start (the value head: the mirror's)
    parallel_metrics = parallel.update(batch, step_index=0)

    after_single, after_parallel = _params(single), _params(parallel)
    assert _worst_relative_difference(start, after_single) > 1e-4  # the step moved the weights
    # Parameters after the step(s), and the gradients themselves: AdamW's first moment after one
    # step is 0.1 × the clipped gradient. Both are needed: Adam's first step hardly depends on
    # the gradient's scale, so a normaliser off by a factor would pass on the parameters alone.
    # At lr 1e-3 float summation order alone (one process, micro-batches of 2 vs 8) moves the
    # parameters by up to 6e-6 relative (Adam's first step ~ lr·sign(g)); at lr 1e-4, by < 1e-6.
    assert _worst_relative_difference(after_single, after_parallel) < 1e-6
    parallel.state_dict()  # the mirror takes rank 0's optimizer states (as before a checkpoint)
    assert _worst_relative_difference(_first_moments(single), _first_moments(parallel)) < 1e-6
    assert parallel.optimizer_step == single.optimizer_step == single.optimizer_steps_per_step()
    for key in ("actor/loss", "actor/grad_norm", "actor/entropy", "actor/clip_frac"):
        if key in single_metrics:
            assert parallel_metrics[key] == pytest.approx(single_metrics[key], rel=1e-5, abs=1e-7), key
    if critic is not None:
        assert parallel_metrics["value/updates"] == 1.0
        assert parallel_metrics["value/loss"] == pytest.approx(single_metrics["value/loss"], rel=1e-5)


@pytest.mark.slow  # the ranks fixture starts a local Ray cluster and two rank actors: not the quick tier
def test_a_non_finite_loss_on_one_rank_stops_every_rank_and_leaves_the_weights(ranks, random_policy_dir):
    """The NaN sits in one row, so only one rank's shard sees it; the guard checks the loss summed
    over the ranks, so both skip together (no rank steps alone, no collective left waiting)."""
    import dataclasses

    from polyrl.learner.nonfinite import NonFiniteStop

    parallel = _data_parallel(ranks, random_policy_dir, "grpo", {"max_consecutive_nonfinite": 1})
    batch = _batch(random_policy_dir)
    nan_batch = dataclasses.replace(batch, advantages=batch.advantages.clone())
    nan_batch.advantages[0, 0] = float("nan")
    before = _params(parallel)
    with pytest.raises(NonFiniteStop) as stop:
        parallel.update(nan_batch, step_index=0)
    assert (stop.value.reason, stop.value.consecutive) == ("loss", 1)
    parallel.pull(optimizers=True)  # rank 0 as it is now
    assert _worst_relative_difference(before, _params(parallel)) == 0.0 and parallel.optimizer_step == 0
    parallel.mirror.guard.load_state_dict({"consecutive": 0})
    parallel.push()
    metrics = parallel.update(batch, step_index=0)  # the ranks are still in step with each other
    assert metrics["health/nonfinite_steps"] == 0 and parallel.optimizer_step == 1


@pytest.mark.slow  # the ranks fixture starts a local Ray cluster and two rank actors: not the quick tier
def test_a_stop_after_an_applied_step_leaves_the_mirror_on_the_ranks_whole_step(ranks, random_policy_dir):
    """Two mini-batches, the NaN in the second: the first optimizer step is applied, the second
    stops the update (the rest skipped, nothing copied or put back). The mirror, which the loop
    checkpoints, then holds rank 0's weights and counter after that one applied step."""
    import dataclasses

    from polyrl.learner.nonfinite import NonFiniteStop

    parallel = _data_parallel(ranks, random_policy_dir, "grpo", {"max_consecutive_nonfinite": 1, "mini_batches": 2})
    batch = _batch(random_policy_dir)
    # The learner's shuffle of step 0 (seed 0): the rows of the second mini-batch.
    order = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(0))
    second = [int(row) for row in torch.tensor_split(order, 2)[1] if ROWS[int(row)][1]]
    nan_batch = dataclasses.replace(batch, advantages=batch.advantages.clone())
    nan_batch.advantages[second[0], 0] = float("nan")
    before = _params(parallel)
    with pytest.raises(NonFiniteStop) as stop:
        parallel.update(nan_batch, step_index=0)
    assert (stop.value.reason, stop.value.applied_steps) == ("loss", 1)
    assert parallel.optimizer_step == 1  # the mirror took the ranks' counter
    mirrored = _params(parallel)
    assert _worst_relative_difference(before, mirrored) > 0  # the applied step is in the mirror
    parallel.pull(optimizers=True)  # rank 0 as it is now: the same weights
    assert _worst_relative_difference(mirrored, _params(parallel)) == 0.0
