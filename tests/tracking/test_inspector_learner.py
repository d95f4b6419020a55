"""The rollout inspector's learner side (polyrl/learner/token_capture.py): a finished tiny run's
page carries the learner's per-token values, and their means are the run's logged metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from polyrl.launch.runner import run_experiment
from polyrl.tracking.inspector import figures

STEPS = 3


def page_data(path: Path) -> dict:
    page = path.read_text()
    return json.loads(page.split("id='data'>", 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))


def _values(rows: list[dict], key: str) -> list:
    return [x for r in rows for x in r["v"].get(key, []) if x is not None]


def _finished_run(tmp_path, tiny_experiment, write_experiment, **overrides):
    # Two mini-batches per rollout: the second trains after an optimizer step, so its ratios leave 1;
    # a narrow clip (0.02) and a high learning rate make some of them clipped.
    config = tiny_experiment(
        objective={"name": "grpo", "params": {"clip_low": 0.02, "clip_high": 0.02}},
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        train={"steps": STEPS, "learning_rate": 3e-2, "micro_batch_size": 4, "mini_batches": 2},
        tracking={"sample_table_every": 2},
        **overrides,
    )
    result = run_experiment(write_experiment(tmp_path, config), console=Console(quiet=True), show_progress=False)
    _, run_id = next(iter(result.arm_run_ids.items()))
    client = MlflowClient(result.tracking_uri)

    def logged(key: str, step: int) -> float:
        return next(m.value for m in client.get_metric_history(run_id, key) if m.step == step)

    pages = {int(p.stem.split("_")[1]): p for p in (tmp_path / "runs").rglob("inspector/step_*.html")}
    return pages, logged


@pytest.mark.slow
def test_the_pages_learner_values_match_the_logged_metrics(tmp_path, tiny_experiment, write_experiment):
    pages, logged = _finished_run(tmp_path, tiny_experiment, write_experiment)
    assert sorted(pages) == [1, 2]  # sample_table_every 2: steps 1 and 2; step 3 captured nothing
    clipped_any = False
    for step, path in pages.items():
        data = page_data(path)
        rows = data["rows"]
        assert {"learner_logprob", "logprob_diff", "entropy", "advantage", "ratio", "clipped"} <= set(data["quantities"])
        assert "masked" not in data["quantities"]  # no rollout correction: nothing to show
        ratios = _values(rows, "ratio")
        # Every trained token has one ratio (4-digit rounding: 5e-4 relative).
        assert len(ratios) == round(logged("train/response_length/mean", step) * logged("train/samples", step))
        assert max(abs(r - 1) for r in ratios) > 1e-3  # the second mini-batch trains after a step
        mean_ratio = sum(ratios) / len(ratios)
        low, high = logged("actor/ratio_min", step), logged("actor/ratio_max", step)
        assert low - 1e-3 <= mean_ratio <= high + 1e-3
        assert mean_ratio == pytest.approx(logged("actor/ratio_mean", step), rel=1e-3)
        assert min(ratios) == pytest.approx(low, rel=1e-3) and max(ratios) == pytest.approx(high, rel=1e-3)
        # "clipped": the tokens the clip_frac metrics count (per token, one pass over the batch).
        clipped = _values(rows, "clipped")
        assert len(clipped) == len(ratios)
        share = sum(clipped) / len(clipped)
        assert share == pytest.approx(logged("actor/clip_frac_low", step) + logged("actor/clip_frac_high", step), abs=1e-6)
        clipped_any |= share > 0
        assert sum(_values(rows, "entropy")) / len(ratios) == pytest.approx(logged("actor/entropy", step), rel=1e-3)
        advantages = _values(rows, "advantage")
        assert sum(advantages) / len(advantages) == pytest.approx(logged("advantage/mean", step), abs=1e-3)
        # The learner's log-prob before the update against the sampler's: rollout/logprob_gap's mean |gap|.
        gaps = [abs(x) for x in _values(rows, "logprob_diff")]
        assert sum(gaps) / len(gaps) == pytest.approx(logged("rollout/logprob_gap", step), rel=0.05, abs=1e-5)
        shown = figures(rows)
        assert shown["ratio_mean"] == pytest.approx(mean_ratio) and shown["clipped"] == pytest.approx(share)
        assert all(math.isfinite(shown[k]) for k in ("advantage_mean", "logprob_gap"))
    assert clipped_any  # the test is not vacuous: the clip removed some token somewhere


def test_capture_keeps_the_first_pass_and_leaves_observation_tokens_unshaded():
    import torch

    from polyrl.learner.token_capture import TokenCapture

    # Row 0: an episode of 5 tokens whose tokens 2 and 3 are an observation (off the response mask);
    # row 1: 2 tokens, the second rejected by a (decoupled) rollout correction, so out of the loss.
    response = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]])
    loss = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]).bool()
    advantages = torch.tensor([[0.5] * 5, [-1.0, 0.0, 0, 0, 0]])
    rejected = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 0, 0, 0]]).bool()
    capture = TokenCapture(response, loss, advantages, rejected)
    capture.learner_logprobs(0, torch.full((2, 5), -1.0))
    ratio = torch.tensor([[1.1, 0.9, 1.0, 1.0, 1.3], [0.7, 1.0, 1.0, 1.0, 1.0]])
    clipped = torch.tensor([[0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]).bool()
    capture.record(torch.tensor([1, 0]), {"ratio": ratio.flip(0), "clipped": clipped.flip(0)}, entropy=torch.ones(2, 5),
                   loss_mask=loss.flip(0))  # fmt: skip
    # A second pass over row 0 (updates_per_batch 2) changes nothing: the first pass is kept.
    capture.record(torch.tensor([0]), {"ratio": torch.full((1, 5), 9.0)}, entropy=None, loss_mask=loss[:1])
    row0, row1 = capture.rows([5, 2])
    assert row0["ratio"] == pytest.approx([1.1, 0.9, None, None, 1.3])
    assert row0["clipped"] == [False, False, None, None, True] and row0["masked"] == [False, False, None, None, False]
    assert row0["learner_logprob"] == [-1.0, -1.0, None, None, -1.0] and row0["entropy"] == [1.0, 1.0, None, None, 1.0]
    # Row 1's second token left the loss: no ratio, advantage or clip flag; "masked" says why.
    assert row1["ratio"] == pytest.approx([0.7, None]) and row1["advantage"] == [-1.0, None]
    assert row1["clipped"] == [True, None] and row1["masked"] == [False, True]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
def test_the_pages_correction_mask_is_the_logged_masked_share(tmp_path, tiny_experiment, write_experiment, mode):
    # ICEPOP masks the tokens whose behaviour-vs-reference ratio leaves a band. The ratios
    # are made to move by the update itself, not by kernel rounding (which differs from machine
    # to machine and can be exactly 0): in bypass mode the band reads the current pi_theta, which
    # the first mini-batch's step at lr 3e-2 has moved for the second; in decoupled mode the
    # band reads the sampler against the proximal policy, so step 2 is sampled one version behind
    # (max_staleness: 1) and the proximal policy has taken step 1's update since.
    # The stale sampler sits further from the proximal policy than one mini-batch step moves
    # pi_theta, hence the wider band in decoupled mode (at [0.8, 1.25] it masked 95% of tokens here, at [0.5, 2] 72%).
    low, high = (0.5, 2.0) if mode == "decoupled" else (0.8, 1.25)
    correction = {"mode": mode, "icepop": {"low": low, "high": high}}
    steps = 2 if mode == "decoupled" else 1
    config = tiny_experiment(
        objective={"name": "grpo", "rollout_correction": correction},
        rollout={
            "prompts_per_step": 2,
            "samples_per_prompt": 4,
            "max_tokens": 8,
            **({"max_staleness": 1} if mode == "decoupled" else {}),
        },
        train={"steps": steps, "learning_rate": 3e-2, "micro_batch_size": 4, "mini_batches": 2},
        tracking={"sample_table_every": 1},
    )
    result = run_experiment(write_experiment(tmp_path, config), console=Console(quiet=True), show_progress=False)
    _, run_id = next(iter(result.arm_run_ids.items()))
    client = MlflowClient(result.tracking_uri)
    history = client.get_metric_history(run_id, "rollout_corr/masked_token_fraction")
    logged = next(m.value for m in history if m.step == steps)
    rows = page_data(next((tmp_path / "runs").rglob(f"inspector/step_{steps:05d}.html")))["rows"]
    masked = _values(rows, "masked")
    assert sum(masked) / len(masked) == pytest.approx(logged, abs=1e-6)
    assert 0 < logged < 1, logged  # the test is not vacuous
    # A masked token left the loss: no ratio, no clip flag.
    for r in rows:
        for k, gone in enumerate(r["v"]["masked"]):
            if gone:
                assert r["v"]["ratio"][k] is None and r["v"]["clipped"][k] is None
