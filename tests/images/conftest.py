"""Fixtures of the image tests: a briefly warmed tiny Idefics3 and scene prompts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from polyrl.core.types import PromptSample
from polyrl.tasks import scenes


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory):
    """The tiny VLM after 40 warm-up steps (~5 s): answers in the right form, often wrong."""
    from polyrl.policies.vlm import warm_vlm_policy

    return warm_vlm_policy(tmp_path_factory.mktemp("vlm_cache"), steps=40, eval_prompts=16)


@pytest.fixture
def scene_prompts():
    """Factory: ``n`` VQA prompts of the test split as PromptSamples with their images."""

    def make(n: int = 3) -> list[PromptSample]:
        rows = scenes.split_rows("test")[:n]
        return [
            PromptSample(
                prompt=r["prompt"],
                references=[r["answer"]],
                images=[scenes.render(scenes.make_scene(r["scene_id"]))],
                fields={"answer": r["answer"]},
            )
            for r in rows
        ]

    return make


@pytest.fixture
def run_experiment_cli(tmp_path, write_experiment, monkeypatch):
    """``run_experiment_cli(config) -> CompletedProcess``: ``polyrl run`` on ``config`` in a
    subprocess, built-in policies cached under tmp_path; asserts it exited 0."""

    def run(config: dict) -> subprocess.CompletedProcess:
        path = write_experiment(tmp_path, config)
        monkeypatch.setenv("POLYRL_CACHE", str(tmp_path / "cache"))
        done = subprocess.run(
            [sys.executable, "-m", "polyrl.cli.main", "run", str(path), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    return run
