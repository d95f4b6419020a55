"""Train a small Bradley–Terry scorer on the shipped arithmetic task, for ``learned_scorer``.

    .venv/bin/python experiments/real/train_arithmetic_scorer.py --model smollm2-135m-instruct \\
        --out runs/scorers/arithmetic_bt --steps 40 --trainable-layers 4

Pairs (polyrl.reward_models.pairwise_training.arithmetic_preference_pairs): the
``arithmetic_chat`` question, the right answer (chosen) and a wrong one in the same form
(rejected). It trains on the train split's pairs and reports the pairwise accuracy on the test
split's pairs (problems the train split never holds, not even commuted: 5 + 7 leaves train when
7 + 5 is in test) before and after training, prints the train loss as it goes and the wall time,
and writes all of it to ``<out>/pairwise_training.json``
beside the scorer (safetensors and tokenizer: a folder for ``learned_scorer``'s ``params.model``).
experiments/real/model_rewards.yaml uses the folder as a reward.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from polyrl.reward_models.pairwise_training import (
    PairwiseSettings,
    arithmetic_preference_pairs,
    evaluate_pairs,
    load_scorer_from_lm,
    save_scorer,
    train_pairwise,
)


def resolve_model(model: str) -> Path:
    """A causal LM folder, or a built-in pretrained model's name (converted once into the cache)."""
    from polyrl.policies.paths import check_model_dir
    from polyrl.policies.pretrained import pretrained_dir

    if Path(model).expanduser().exists():
        return check_model_dir(Path(model).expanduser(), field="--model")
    return pretrained_dir(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a causal LM folder, or a built-in name (smollm2-135m-instruct)")
    parser.add_argument("--out", required=True, type=Path, help="the scorer folder to write")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--batch-pairs", type=int, default=8, help="preference pairs per step")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--trainable-layers",
        type=int,
        default=4,
        help="train the last N transformer layers, the final norm and the head; -1: all",
    )
    parser.add_argument("--train-pairs", type=int, default=None, help="use the first N train-split pairs (default: all)")
    parser.add_argument("--eval-pairs", type=int, default=None, help="use the first N test-split pairs (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.trainable_layers < -1:
        parser.error(f"--trainable-layers: -1 (all) or a non-negative integer, got {args.trainable_layers}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        settings = PairwiseSettings(
            steps=args.steps,
            batch_pairs=args.batch_pairs,
            learning_rate=args.learning_rate,
            trainable_layers=None if args.trainable_layers == -1 else args.trainable_layers,
            seed=args.seed,
        )
    except ValueError as error:
        parser.error(f"--{str(error).replace('_', '-')}")

    started = time.perf_counter()
    folder = resolve_model(args.model)
    train = arithmetic_preference_pairs("train", seed=args.seed, limit=args.train_pairs)
    test = arithmetic_preference_pairs("test", seed=args.seed, limit=args.eval_pairs)
    model, tokenizer = load_scorer_from_lm(folder, seed=args.seed)
    print(f"scorer from {folder}: {len(train)} train pairs, {len(test)} held-out (test split) pairs", flush=True)

    def summary(metrics: dict[str, float]) -> str:
        # near: the right answer ± a few; other: another problem's answer (often tellable by size).
        kinds = ", ".join(f"{key.split('/')[1]} {value:.3f}" for key, value in metrics.items() if key.startswith("accuracy/"))
        return (
            f"pairwise accuracy {metrics['accuracy']:.3f} ({kinds}), loss {metrics['loss']:.4f}, margin {metrics['margin']:+.3f}"
        )

    before = evaluate_pairs(model, tokenizer, test)
    print(f"held-out before: {summary(before)}", flush=True)

    every = max(1, settings.steps // 20)

    def report(step: int, metrics: dict[str, float]) -> None:
        if step % every == 0 or step == settings.steps:
            print(
                f"step {step}/{settings.steps}: train loss {metrics['loss']:.4f}, batch accuracy {metrics['accuracy']:.2f}",
                flush=True,
            )

    train_started = time.perf_counter()
    history = train_pairwise(model, tokenizer, train, settings, on_step=report)
    train_seconds = time.perf_counter() - train_started

    after = evaluate_pairs(model, tokenizer, test)
    print(f"held-out after:  {summary(after)}", flush=True)
    save_scorer(model, tokenizer, args.out)
    wall = time.perf_counter() - started
    record = {
        "base_model": str(folder),
        "settings": {**vars(settings), "trainable_layers": settings.trainable_layers},
        "train_pairs": len(train),
        "held_out_pairs": len(test),
        "held_out_before": before,
        "held_out_after": after,
        "train_loss": [m["loss"] for m in history],
        "train_seconds": train_seconds,
        "wall_seconds": wall,
        "torch_threads": torch.get_num_threads(),
    }
    (args.out / "pairwise_training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"wrote {args.out} (learned_scorer params.model) and {args.out / 'pairwise_training.json'}; wall time {wall:.0f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
