"""Reward modules: the protocol, the registry, the built-ins and their weighted composition.

from polyrl.rewards import CompositeReward, RewardBatch, RewardSpec
reward = CompositeReward([RewardSpec(module="rouge_l"), RewardSpec(module="length", weight=0.1)])
result = reward.score(RewardBatch(prompts=[...], completions=[...], references=[[...], ...]))
result.totals, result.per_module, result.metrics()
"""

from polyrl.rewards import builtins  # noqa: F401  (registers the built-in modules)
from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule, RewardModuleError
from polyrl.rewards.composite import CompositeReward, RewardResult, RewardSpec, run_module
from polyrl.rewards.registry import (
    ENTRY_POINT_GROUP,
    load_reward_class,
    register_reward,
    registered_rewards,
    reward_entry_points,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "CompositeReward",
    "RewardBatch",
    "RewardConfigError",
    "RewardModule",
    "RewardModuleError",
    "RewardResult",
    "RewardSpec",
    "load_reward_class",
    "register_reward",
    "registered_rewards",
    "reward_entry_points",
    "run_module",
]
