"""The pairwise (Bradley–Terry) scorer trainer: the loss by hand, the arithmetic preference pairs,
a few training steps on the tiny chat model (tests/chat_models.py) whose saved folder the real
``learned_scorer`` module loads and scores, and ``polyrl eval`` reporting that scorer's reward."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

from polyrl.reward_models.pairwise_training import (
    PairwiseSettings,
    PreferencePair,
    arithmetic_preference_pairs,
    bradley_terry_loss,
    evaluate_pairs,
    load_scorer_from_lm,
    pair_scores,
    save_scorer,
    set_trainable_layers,
    train_pairwise,
)
from polyrl.reward_models.scorer import LearnedScorer
from polyrl.rewards.base import RewardBatch
from polyrl.tasks import arithmetic


def test_bradley_terry_loss_by_hand():
    chosen = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 3.0])
    loss, metrics = bradley_terry_loss(chosen, rejected)
    # margins 2, 0, -2; -log σ(m) = log(1 + e^-m):
    #   log(1 + e^-2) = log(1.135335) = 0.126928
    #   log(1 + 1)    = 0.693147
    #   log(1 + e^2)  = log(8.389056) = 2.126928
    # mean = (0.126928 + 0.693147 + 2.126928) / 3 = 2.947003 / 3 = 0.982334
    assert loss.item() == pytest.approx(0.982334, abs=1e-6)
    assert metrics["loss"] == pytest.approx(0.982334, abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(1 / 3)  # the tie (margin 0) is not a win
    assert metrics["margin"] == pytest.approx(0.0)  # (2 + 0 - 2) / 3
    # d loss / d r_c = -σ(-m) / 3: σ(-2) = 0.119203, σ(0) = 0.5, σ(2) = 0.880797
    loss.backward()
    assert chosen.grad.tolist() == pytest.approx([-0.119203 / 3, -0.5 / 3, -0.880797 / 3], abs=1e-6)


def test_bradley_terry_loss_is_stable_and_refuses_mismatched_scores():
    loss, metrics = bradley_terry_loss(torch.tensor([-100.0]), torch.tensor([100.0]))
    assert float(loss) == pytest.approx(200.0)  # log(1 + e^200) = 200 + log(1 + e^-200), no overflow
    assert metrics["accuracy"] == 0.0
    with pytest.raises(ValueError, match="same non-zero length"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))


def test_arithmetic_pairs_are_right_vs_wrong_and_the_splits_share_no_prompt():
    train, test = arithmetic_preference_pairs("train"), arithmetic_preference_pairs("test")
    # The train pairs leave out the 12 rows whose commuted problem the test split holds (below).
    assert len(train) == len(arithmetic.read_rows("train")) - 12 and len(test) == len(arithmetic.read_rows("test"))
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    for pair in train + test:
        # The prompt is the arithmetic_chat source's question; the answer is the last number.
        a, op, b = (int(w) if w.isdigit() else w for w in pair.prompt.split("?")[0].split()[2:5])
        right = arithmetic.compute_answer(a, op, b)
        assert pair.prompt == arithmetic.chat_question(a, op, b)
        assert int(pair.chosen.rstrip(".").split()[-1]) == right
        wrong = int(pair.rejected.rstrip(".").split()[-1])
        assert wrong != right and wrong >= 0
        # Same form: the texts differ only in the number.
        last_number = re.compile(r"\d+(?=\D*$)")
        assert last_number.sub("N", pair.chosen) == last_number.sub("N", pair.rejected)
        # near: the right answer ± 1, 2 or 10; other: another row's answer (any distance).
        assert pair.kind in ("near", "other") and (pair.kind == "other" or abs(wrong - right) in (1, 2, 10))
    assert {p.kind for p in test} == {"near", "other"}
    assert arithmetic_preference_pairs("test", seed=0) == test
    assert arithmetic_preference_pairs("test", seed=1) != test


def chat_problem(prompt: str) -> tuple[str, int, int]:
    """``(op, a, b)`` of an ``arithmetic_chat`` question, a sum's operands sorted (read here from
    the text, not through the module under test)."""
    a, op, b = prompt.split("?")[0].split()[2:5]
    x, y = int(a), int(b)
    return (op, min(x, y), max(x, y)) if op == "+" else (op, x, y)


def test_no_unordered_problem_is_in_both_splits_of_the_pairs():
    # The task splits by prompt, so 7 + 5 (test) and 5 + 7 (train) both existed: 12 of the 200
    # test problems had their commuted twin among the train pairs, which a scorer can learn from.
    task_train = {
        chat_problem(arithmetic.chat_question(*arithmetic.parse_prompt(r["prompt"]))) for r in arithmetic.read_rows("train")
    }
    test_problems = {chat_problem(p.prompt) for p in arithmetic_preference_pairs("test")}
    assert len(test_problems & task_train) == 12  # the shipped data's overlap, which the pairs must not keep
    train_problems = {chat_problem(p.prompt) for p in arithmetic_preference_pairs("train")}
    assert not train_problems & test_problems
    # Subtraction does not commute: 12 - 7 and 7 - 12 would stay apart (none is negative here anyway).
    assert chat_problem("What is 12 - 7? Answer.") != chat_problem("What is 7 - 12? Answer.")


def test_trainable_layers_freeze_the_rest_and_bad_counts_are_refused(chat_model_dir):
    model, _ = load_scorer_from_lm(chat_model_dir)
    names = set_trainable_layers(model, 1)
    assert any(n.startswith("score.") for n in names) and any(n.startswith("model.layers.1.") for n in names)
    assert "model.norm.weight" in names
    assert not any(n.startswith(("model.layers.0.", "model.embed_tokens.")) for n in names)
    assert set_trainable_layers(model, 0) == ["score.weight"]
    assert len(set_trainable_layers(model, None)) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="trainable_layers: 3, but the model has 2 layers"):
        set_trainable_layers(model, 3)
    with pytest.raises(ValueError, match="steps: a positive integer"):
        PairwiseSettings(steps=0)


PAIRS = arithmetic_preference_pairs("train", limit=8)
SETTINGS = PairwiseSettings(steps=20, batch_pairs=8, learning_rate=1e-2, trainable_layers=1, seed=0)


@pytest.fixture(scope="module")
def trained(chat_model_dir, tmp_path_factory):
    model, tokenizer = load_scorer_from_lm(chat_model_dir, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    start = evaluate_pairs(model, tokenizer, PAIRS)
    history = train_pairwise(model, tokenizer, PAIRS, SETTINGS)
    folder = save_scorer(model, tokenizer, tmp_path_factory.mktemp("trained_scorer") / "scorer")
    after = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {
        "model": model,
        "tokenizer": tokenizer,
        "before": before,
        "after": after,
        "start": start,
        "history": history,
        "folder": folder,
    }


@pytest.mark.slow  # trains 20 steps (the module fixture)
def test_training_lowers_the_loss_and_moves_only_the_trainable_layers(trained):
    losses = [m["loss"] for m in trained["history"]]
    assert len(losses) == SETTINGS.steps and all(math.isfinite(v) for v in losses)
    # Each step sees all 8 pairs: the loss of the last steps is well below the first's.
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]
    before, after = trained["before"], trained["after"]
    for name in before:
        moved = not torch.equal(before[name], after[name])
        frozen = name.startswith(("model.layers.0.", "model.embed_tokens."))
        assert moved != frozen, f"{name}: moved={moved}, frozen={frozen}"


@pytest.mark.slow  # trains 20 steps (the module fixture)
def test_the_saved_folder_scores_through_learned_scorer_as_in_training(trained):
    scorer = LearnedScorer(model=str(trained["folder"]))
    batch = RewardBatch(
        prompts=[p.prompt for p in PAIRS] * 2, completions=[p.chosen for p in PAIRS] + [p.rejected for p in PAIRS]
    )
    scores = scorer.score(batch)
    chosen, rejected = scores[: len(PAIRS)], scores[len(PAIRS) :]
    assert sum(c > r for c, r in zip(chosen, rejected)) >= 7, (chosen, rejected)
    # The trainer and the reward module read the same text, padded the same way: equal scores.
    with torch.no_grad():
        c, r = pair_scores(trained["model"], trained["tokenizer"], PAIRS)
    assert chosen == pytest.approx(c.tolist(), abs=1e-4) and rejected == pytest.approx(r.tolist(), abs=1e-4)
    # Unseen pairs are scored too (held-out accuracy is what the script reports; not asserted
    # here: a 2-layer random model does not learn arithmetic from 8 pairs).
    held = evaluate_pairs(trained["model"], trained["tokenizer"], [PreferencePair("What is 1 + 1?", "2", "3")])
    assert math.isfinite(held["loss"]) and held["pairs"] == 1.0


@pytest.mark.slow  # the module fixture's training, then polyrl eval in process
def test_polyrl_eval_reports_the_trained_scorer(trained, tmp_path, random_policy_dir):
    from polyrl.cli.main import app

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.chosen}) + "\n" for p in PAIRS[:3]))
    suite = tmp_path / "scored.yaml"
    suite.write_text(
        json.dumps(
            {
                "name": "scored",
                "datasets": [{"name": "q", "source": "q.jsonl"}],
                "generation": {"decoding": "greedy", "max_tokens": 4},
                "metrics": {"rewards": [{"module": "learned_scorer", "params": {"model": str(trained["folder"])}}]},
            }
        )
    )
    out = tmp_path / "report"
    args = ["eval", "--model", str(random_policy_dir), "--suite", str(suite), "--engine", "hf", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert math.isfinite(report["metrics"]["q/reward/learned_scorer/mean"])


@pytest.mark.slow  # loads and trains the tiny chat model for 2 steps
def test_the_script_writes_a_scorer_folder_and_its_figures(chat_model_dir, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "real" / "train_arithmetic_scorer.py"
    spec = importlib.util.spec_from_file_location("train_arithmetic_scorer", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "scorer"
    args = ["--model", str(chat_model_dir), "--out", str(out), "--steps", "2", "--train-pairs", "8", "--eval-pairs", "4"]
    assert script.main([*args, "--trainable-layers", "1", "--learning-rate", "1e-3"]) == 0
    printed = capsys.readouterr().out
    assert "held-out before: pairwise accuracy" in printed and "held-out after:" in printed and "wall time" in printed
    record = json.loads((out / "pairwise_training.json").read_text())
    assert record["train_pairs"] == 8 and record["held_out_pairs"] == 4 and len(record["train_loss"]) == 2
    assert record["settings"]["trainable_layers"] == 1 and record["held_out_after"]["pairs"] == 4.0
    after = record["held_out_after"]
    # The per-kind accuracies are the overall one split by kind (pairs-weighted mean).
    kinds = [k.split("/")[1] for k in after if k.startswith("pairs/")]
    assert kinds and sum(after[f"accuracy/{k}"] * after[f"pairs/{k}"] for k in kinds) / 4 == pytest.approx(after["accuracy"])
    assert LearnedScorer(model=str(out)).score(RewardBatch(prompts=["What is 1 + 1?"], completions=["2"]))[0] is not None
    with pytest.raises(SystemExit):
        script.main(["--model", str(chat_model_dir), "--out", str(out), "--steps", "0"])
