"""scripts/repro_bapo_summary.py: whole-run summaries of one seed run's metric histories."""

from __future__ import annotations

import pytest

from tests.analysis.script_modules import load_script


@pytest.fixture(scope="module")
def summary_module():
    return load_script("repro_bapo_summary")


def test_summarise_bapo_history_by_hand(summary_module):
    history = {
        "actor/entropy": [(1, 0.15), (2, 0.12), (3, 0.09), (4, 0.08)],
        "bapo/positive_share": [(1, 0.52), (2, 0.46), (3, 0.50), (4, 0.60)],
        "train/accuracy": [(1, 0.25), (2, 0.50), (3, 0.75), (4, 1.0)],
        "eval/arithmetic/accuracy": [(0, 0.35), (4, 0.40)],
        "actor/positive_share": [(1, 0.40), (2, 0.70)],
    }
    out = summary_module.summarise(history, target=0.5)
    # entropy mean (0.15 + 0.12 + 0.09 + 0.08) / 4 = 0.44 / 4 = 0.11; first value < 0.1 at step 3
    assert out["entropy, mean over steps"] == pytest.approx(0.11, abs=1e-12)
    assert out["first step with entropy < 0.1"] == 3.0
    # share mean 2.08 / 4 = 0.52; |share - 0.5| = 0.02, 0.04, 0, 0.10 -> mean 0.16 / 4 = 0.04
    assert out["bapo/positive_share, mean"] == pytest.approx(0.52, abs=1e-12)
    assert out["bapo/positive_share, mean abs(share − target)"] == pytest.approx(0.04, abs=1e-12)
    # within 0.5 ± 0.03: 0.52 and 0.50 -> 2 of 4; below 0.5: only 0.46 -> 1 of 4
    assert out["steps with positive share within ±0.03 of target (share)"] == 0.5
    assert out["steps with positive share below target (share)"] == 0.25
    # fewer than 10 steps: the "last 10" mean is over all 4: 2.5 / 4 = 0.625
    assert out["train accuracy, mean of last 10 steps"] == pytest.approx(0.625, abs=1e-12)
    assert (out["held-out accuracy, first eval"], out["held-out accuracy, last eval"]) == (0.35, 0.40)
    # every objective's share at its own bounds: mean (0.40 + 0.70) / 2 = 0.55; |0.40 - 0.5| = 0.10, |0.70 - 0.5| = 0.20 -> 0.15
    assert out["actor/positive_share, mean"] == pytest.approx(0.55, abs=1e-12)
    assert out["actor/positive_share, mean abs(share − target)"] == pytest.approx(0.15, abs=1e-12)
    # another suite's held-out accuracy is read by its own key
    chat = summary_module.summarise(
        {"eval/arithmetic_chat/accuracy": [(0, 0.28), (12, 0.5)]}, target=0.5, eval_key="eval/arithmetic_chat/accuracy"
    )
    assert (chat["held-out accuracy, first eval"], chat["held-out accuracy, last eval"]) == (0.28, 0.5)


def test_summarise_leaves_out_what_a_run_did_not_log(summary_module):
    out = summary_module.summarise({"actor/entropy": [(1, 0.2), (2, 0.19)], "bapo/positive_share": []}, target=0.5)
    assert not any(name.startswith(("bapo/", "steps with positive share")) for name in out)
    # entropy never falls below 0.1: reported as one past the last step
    assert out["first step with entropy < 0.1"] == 3.0


def test_the_difference_table_is_paired_by_seed_and_holm_corrected(summary_module, tmp_path):
    # Per-seed differences of "q" = [2, 3, 4]: paired (0.516, 5.48), p = 0.035 (tests/analysis/test_stats.py);
    # "r" differs by exactly 0 at every seed: p = 1. Holm over 2 rows: 0.035 × 2 = 0.070 → no longer significant.
    summaries = {
        "a": {0: {"q": 10.0, "r": 1.0}, 1: {"q": 20.0, "r": 2.0}, 2: {"q": 30.0, "r": 3.0}},
        "b": {0: {"q": 8.0, "r": 1.0}, 1: {"q": 17.0, "r": 2.0}, 2: {"q": 26.0, "r": 3.0}},
    }
    lines = summary_module.difference_table(summaries)
    row = next(line for line in lines if line.startswith("| q |"))
    assert "+3 [0.516, 5.48] (paired) | 0.07 |" in row and " * " not in row
    assert any("q: a vs b: not distinguishable from noise after Holm's correction over 2 comparisons" in line for line in lines)
    # The same numbers read back from the per-seed lines a summary.md holds.
    text = "\n".join(
        ["| quantity | a | b |", "|---|---|---|", "| q | x | y |", "| r | x | y |", ""]
        + [
            f"- {arm} seed {seed}: steps 3, q {v['q']}, r {v['r']}"
            for arm, by_seed in summaries.items()
            for seed, v in by_seed.items()
        ]
    )
    (tmp_path / "summary.md").write_text(text)
    assert summary_module.read_summary(tmp_path / "summary.md") == summaries


def test_pairs_give_one_table_each(summary_module, capsys):
    # arms a, b, c: the pair c:b differences only those two (per-seed c - b of "q" = 1, 1, 1: interval [1, 1]).
    summaries = {
        "a": {0: {"q": 10.0}, 1: {"q": 20.0}},
        "b": {0: {"q": 8.0}, 1: {"q": 17.0}},
        "c": {0: {"q": 9.0}, 1: {"q": 18.0}},
    }
    summary_module.print_tables(summaries, ["c:b", "a:b"])
    out = capsys.readouterr().out
    assert "### c vs b" in out and "### a vs b" in out and "c − b" in out and "a − b" in out
    assert "+1 [1, 1] (paired)" in out
    with pytest.raises(SystemExit, match="no finished runs of arm"):
        summary_module.print_tables(summaries, ["a:z"])
