"""A small warmed-up drawing policy shared by the drawing tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def drawing_policy_dir(tmp_path_factory) -> Path:
    """The drawing policy after 60 warm-up steps (~15 s on one core): it writes well-formed
    grids between the markers, mostly right in colour and often wrong in shape."""
    from polyrl.policies.drawing import build_drawing_policy

    return build_drawing_policy(tmp_path_factory.mktemp("drawing_cache"), steps=60, eval_prompts=16)
