"""Advantage estimators: pure tensor functions registered by name.

Uniform call shape. Every registered estimator takes one :class:`AdvantageInputs` and its
params as keywords::

    inputs = AdvantageInputs(rewards, mask, group_ids, values, gammas, lambdas)  # None where absent
    advantages, metrics = spec.fn(inputs, **params)   # spec.default_params overridden by config

The learner passes every tensor it has; each estimator uses what it needs and raises
``ValueError`` naming a required tensor that is missing (``spec.requires`` lists them up
front, e.g. to decide whether a value head is needed). Unknown ``params`` raise ``TypeError``.
``advantages`` is [B, T] and zero off the response. Each registration declares its params as a
typed model (``spec.params``, see :mod:`polyrl.algos.params`), checked at config load;
``spec.default_params`` holds its defaults.

Rewards of either shape are accepted by every estimator: sequence estimators sum [B, T] token
rewards over response tokens; GAE places [B] sequence rewards on each row's last response token.

Unscored samples: a NaN reward (in a [B] reward, or on any response token of a [B, T] row)
marks a sample the reward modules could not score. It is left out of every statistic (group
mean, std and leave-one-out baseline, batch std, whitening) and its advantage is 0; GAE's value
target for it is its own value (advantage 0). Metrics cover scored samples only.

Estimators that train a critic set ``spec.value_targets``: a function with the same call shape
returning ``(returns [B, T], metrics)``, the targets for the value loss (``returns = A + V``
before any whitening).

Layout: :mod:`.registry` (specs, :class:`AdvantageInputs`), :mod:`.common` (reward shapes,
metrics), one module per family (:mod:`.group`: GRPO, Dr.GRPO, RLOO; :mod:`.gae`; :mod:`.reinforce`:
REINFORCE++, REINFORCE++-baseline, ReMax, GPG). :mod:`.gdpo` is no estimator but how several rewards
reach ``group_norm`` (``advantage.reward_aggregation: gdpo``): each normalised within its group apart.
"""

from polyrl.algos.advantages.common import (  # noqa: I001 - registration order, below
    advantage_metrics,
    broadcast_to_tokens,
    last_response_index,
    scored_mask,
    sequence_rewards,
    token_rewards,
    unscored_rows,
)

# Import order is registration order, the order estimators are listed in: group ones, then GAE,
# then the REINFORCE family.
from polyrl.algos.advantages.group import (
    STD_SCALES,
    group_mean_centered_advantages,
    group_norm_advantages,
    group_normalized,
    rloo_advantages,
)
from polyrl.algos.advantages.gae import gae_advantages, gae_value_targets, generalized_advantage_estimation, masked_whiten
from polyrl.algos.advantages.reinforce import (
    global_whiten,
    gpg_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from polyrl.algos.advantages.registry import (
    INPUT_NAMES,
    AdvantageFn,
    AdvantageInputs,
    AdvantageSpec,
    get_advantage,
    list_advantages,
    register_advantage,
)
from polyrl.algos.dapo_data import dapo_dynamic_sampling_keep, dapo_overlong_penalty
from polyrl.algos.groups import group_mean_std

__all__ = [
    "INPUT_NAMES", "STD_SCALES", "AdvantageFn", "AdvantageInputs", "AdvantageSpec", "advantage_metrics",
    "broadcast_to_tokens", "dapo_dynamic_sampling_keep", "dapo_overlong_penalty", "gae_advantages",
    "gae_value_targets", "generalized_advantage_estimation", "get_advantage", "group_mean_centered_advantages",
    "group_mean_std", "group_norm_advantages", "group_normalized", "last_response_index", "list_advantages",
    "masked_whiten", "register_advantage", "rloo_advantages", "scored_mask", "sequence_rewards", "token_rewards",
    "unscored_rows", "global_whiten", "gpg_advantages", "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages", "remax_advantages",
]  # fmt: skip
