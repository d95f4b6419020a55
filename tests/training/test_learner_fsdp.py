"""FSDP2 for real: two processes over gloo on the CPU, the policy sharded with ``fully_shard``
(runtime/fsdp.shard_model), give the same update as one process, also where the ranks' shards
differ by a row or one rank's shard is empty (its micro-batch count evened by zero-weight passes;
before, the ranks ran different numbers of forwards and backwards, FSDP2's collectives in each,
and waited on each other until the group's time-out)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fsdp_cases import CASES, learner_for, shared_batch
from run_control import free_port
from safetensors.torch import load_file

pytestmark = [pytest.mark.distributed, pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed")]

WORKER = Path(__file__).with_name("fsdp_worker.py")


@pytest.fixture(scope="module")
def two_ranks(random_policy_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(port), str(random_policy_dir), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = []
    for rank in ranks:
        try:
            logs.append(rank.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            pytest.fail("the FSDP2 ranks did not finish within 120 s (a collective that one rank never joined?)")
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(log[-3000:] for log in logs)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp2_over_gloo_gives_the_single_process_update(two_ranks, random_policy_dir, case):
    single = learner_for(str(random_policy_dir), case)
    before = {name: p.detach().clone() for name, p in single.policy.named_parameters()}
    metrics = single.update(shared_batch(), 0)
    sharded = load_file(str(two_ranks / f"{case}.safetensors"))
    sharded_metrics = json.loads((two_ranks / f"{case}.json").read_text())
    assert sharded_metrics["optimizer_step"] == single.optimizer_step > 1
    moved = 0
    for name, parameter in single.policy.state_dict().items():
        torch.testing.assert_close(sharded[name], parameter, rtol=1e-5, atol=1e-6, msg=f"{case}: {name}")
        moved += name in before and not torch.equal(before[name], parameter)
    assert moved > 0  # the update moved the weights (so equal means equal updates)
    for key in ("actor/loss", "actor/grad_norm", "actor/ratio_max", "actor/ratio_min", "actor/pos_loss_share", "actor/entropy"):
        assert sharded_metrics[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key


def test_a_sharded_critic_is_refused_before_any_rank_starts():
    """The critic's micro-batch loop is not evened across ranks yet: on CUDA (FSDP2) a critic with
    several learner ranks is refused by name instead of hanging in a collective."""
    from polyrl.learner.critic import CriticSettings
    from polyrl.learner.policy_learner import LearnerSettings
    from polyrl.learner.ranks import LearnerRanksError, RankRecipe, start_data_parallel_learner

    recipe = RankRecipe(
        policy_path="unused",
        objective="ppo",
        settings=LearnerSettings(aggregation="token_mean"),
        critic=CriticSettings(),
        cuda=True,
    )
    with pytest.raises(LearnerRanksError, match=r"train.learner_workers: 2 on CUDA shards the critic .*allowed: "):
        start_data_parallel_learner(None, recipe, 2)
