"""The objectives page (generated from the registry, polyrl/cli/docs_reference.py) states each
default that differs from verl's and the estimator choices that differ from verl's, in the
registry entries' deviation text, so ``polyrl objectives show NAME`` and docs/objectives.md carry them."""

from __future__ import annotations

import pytest

from polyrl.algos.objectives import get_objective
from polyrl.cli.docs_reference import objectives_markdown


def section(page: str, name: str) -> str:
    start = page.index(f"### `{name}` ")
    end = page.find("\n### ", start + 1)
    return page[start : end if end >= 0 else None]


@pytest.mark.parametrize(
    "name, phrases",
    [
        # verl's cispo reads clip_ratio_low/high (0.2 each): its weight stays in [0.8, 1.2].
        ("cispo", ["[0.8, 1.2]", "clip_ratio_low 10", "cap 5"]),
        # verl's geo_mean reads the shared clip 0.2; the paper's (and polyrl's) is 0.4.
        ("gmpo", ["0.4", "clip_ratio_low/high 0.2"]),
        # KL-Cov: share 2e-3 here against verl's 2e-4; beta 1 here against verl's ppo_kl_coef 0.1.
        ("kl_cov", ["kl_cov_ratio 2e-4", "ppo_kl_coef 0.1", "kl_cov_ratio 2e-3"]),
        # GPG: the paper's alpha = B/(B - M); verl's B / nonzero rewards (2 against 4 in the example).
        ("gpg", ["B/(B - M)", "nonzero reward", "4/2 = 2", "4/1 = 4"]),
        # REINFORCE++: the return crosses masked observation tokens here; verl zeroes it there.
        ("reinforce_pp", ["carries across them", "zeroes its running return"]),
        # verl's vanilla PPO loss dual-clips at 3 by default; polyrl's dual_clip is off.
        ("ppo", ["clip_ratio_c, 3 by default"]),
        ("grpo", ["clip_ratio_c, 3 by default", "kl_loss_coef 0.001"]),
        ("dr_grpo", ["clip_ratio_c, 3 by default"]),
        ("dapo", ["clip_ratio_high to 0.2", "clip_ratio_c, 3 by default"]),
        ("gspo", ["3e-4 / 4e-4", "0.2 by default"]),
        ("gspo_token", ["3e-4 / 4e-4", "0.2 by default"]),
    ],
)
def test_the_generated_page_states_where_defaults_differ_from_verl(name, phrases):
    text = section(objectives_markdown(), name)
    for phrase in phrases:
        assert phrase in text, f"{name}: {phrase!r} missing from its deviations"
    assert all(phrase in get_objective(name).deviations for phrase in phrases)
