"""``model.freeze`` changed on ``--resume --allow-config-change``: refused up front, naming the field.

Accepted, the change let the run start, and loading the checkpoint's optimizer state (moments
for the parameters that trained before) then failed with torch's long ValueError about
parameter groups."""

from __future__ import annotations

import pytest

from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.launch.resume_config import check_resume_changes, config_snapshot, resume_changes


def _snapshot(**overrides):
    return config_snapshot(ExperimentConfig.model_validate({"name": "e", **overrides}))


@pytest.mark.parametrize(
    "old, new",
    [
        ({}, {"freeze": {"parts": ["embeddings"]}}),  # frozen parts added
        ({"freeze": {"first_layers": 1}}, {}),  # removed
        ({"freeze": {"first_layers": 1}}, {"freeze": {"first_layers": 2}}),  # changed
    ],
    ids=["added", "removed", "changed"],
)
def test_a_change_of_frozen_parts_is_refused_on_resume_even_with_the_flag(old, new):
    changes = {"main": resume_changes("main", _snapshot(model=old), _snapshot(model=new))}
    with pytest.raises(ConfigError, match=r"--allow-config-change: these changes cannot apply") as caught:
        check_resume_changes(changes, finished=set(), allow=True, resume_steps={"main": 2})
    message = str(caught.value)
    assert "model.freeze" in message and "optimizer state" in message


def test_unchanged_frozen_parts_resume():
    frozen = _snapshot(model={"freeze": {"parts": ["embeddings"]}}, train={"steps": 4})
    longer = _snapshot(model={"freeze": {"parts": ["embeddings"]}}, train={"steps": 8})
    check_resume_changes({"main": resume_changes("main", frozen, longer)}, finished=set(), allow=True, resume_steps={"main": 2})
