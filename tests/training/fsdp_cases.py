"""The batch and learner settings tests/training/test_learner_fsdp.py and its worker ranks share."""

from __future__ import annotations

from typing import Any, Callable

import torch

from polyrl.algos.objectives import get_objective
from polyrl.core.types import Completion
from polyrl.engines.image_prompts import auto_model_class
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions
from polyrl.rollout.batches import LearnerBatch

# Rows of different lengths (prompt ids, completion ids); one has no completion tokens.
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

# Each case cuts the 8 rows so that the two ranks run different numbers of micro-batches.
CASES: dict[str, dict[str, Any]] = {
    # Mini-batches of 3, 3 and 2 rows: shards of 2 and 1 rows, one row per micro-batch.
    "shards_differ_by_a_row": {"objective": "grpo", "mini_batches": 3, "micro_batch_size": 1},
    # Mini-batches of one row: the other rank's shard is empty (one zero-weight pass each).
    "one_rank_empty": {"objective": "ppo", "mini_batches": 8, "micro_batch_size": 2},
}


def shared_batch() -> LearnerBatch:
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in ROWS
    ]
    packed = pack_completions(completions, pad_token_id=0)
    generator = torch.Generator().manual_seed(0)
    mask = packed.response_mask
    advantages = torch.randn(mask.shape, generator=generator) * mask
    old = (torch.randn(mask.shape, generator=generator) * 0.3 - 4.0) * mask
    return LearnerBatch(packed=packed, old_logprobs=old, advantages=advantages)


def learner_for(
    policy_dir: str, case: str, *, shard: Callable[[torch.nn.Module], None] | None = None, group: Any = None
) -> PolicyLearner:
    """The case's learner; ``shard`` (FSDP2) is applied before the optimizer is built."""
    settings = dict(CASES[case])
    spec = get_objective(settings.pop("objective"))
    policy = auto_model_class(policy_dir).from_pretrained(str(policy_dir), dtype=torch.float32)
    if shard is not None:
        shard(policy)
    learner_settings = LearnerSettings(
        aggregation=spec.default_aggregation,
        objective_params=dict(spec.default_params),
        learning_rate=1e-3,
        total_steps=1,
        **settings,
    )
    return PolicyLearner(policy, spec, learner_settings, group=group)
