"""The warmed-up drawing policy: a tiny Qwen3 whose tokenizer draws in palette tokens.

The character tokenizer gains the eight palette tokens and the ``<img>`` / ``</img>`` markers
as single (non-special, so decoded text keeps them) tokens; the model directory also gets the
modality rule (:mod:`polyrl.engines.modality_marks`) that makes palette tokens between the
markers ``image`` tokens in both rollout engines.

``build_drawing_policy`` warms the model up with the arithmetic warm-up's supervised loop
(:func:`polyrl.policies.warmup.supervised_finetune`) on the drawing train split, for few enough
steps that held-out per-cell accuracy is partial and RL has room, and caches the directory
under ``cache_dir/<key>/`` exactly like the arithmetic policy (the shared
:class:`~polyrl.policies.recipe.WarmupRecipe`: temporary folder, rename, completion marker). ``polyrl_warmup.json`` records held-out greedy and sampled per-cell
accuracy, well-formed share, exact-grid share and caption F1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken

from polyrl.engines.modality_marks import write_modality_rule
from polyrl.policies.cache import INFO_FILE, held_out_examples
from polyrl.policies.recipe import WarmupRecipe
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm, save_model_dir
from polyrl.policies.warmup import model_fingerprint, supervised_finetune
from polyrl.rewards import RewardBatch
from polyrl.rewards.builtins.drawing import IMAGE_CLOSE, IMAGE_OPEN, PALETTE_TOKENS, Drawing
from polyrl.tasks import drawing

# Bump when a change here alters the weights or the recorded info of a build.
DRAWING_CODE_VERSION = "2"
DRAWING_TOKENS = (IMAGE_OPEN, IMAGE_CLOSE, *PALETTE_TOKENS)

DEFAULT_SIZE = "0.3m"
DEFAULT_STEPS = 100
DEFAULT_LR = 2e-3
DEFAULT_BATCH_SIZE = 32
# <img> + 9 cells + </img> + a caption of at most ~45 characters + EOS.
MAX_NEW_TOKENS = 64


def build_drawing_tokenizer(model_max_length: int = 512):
    """The character tokenizer plus the markers and palette tokens, each one token."""
    tokenizer = build_char_tokenizer(model_max_length)
    # special=False: decoding with skip_special_tokens (both engines do) keeps them in the text.
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in DRAWING_TOKENS])
    return tokenizer


def drawing_fingerprint(size: str) -> str:
    """A hash of what defines the untrained model: size entry, vocabulary and builder code."""
    return model_fingerprint(size, DRAWING_TOKENS)


@torch.no_grad()
def evaluate_drawing(
    model: torch.nn.Module,
    tokenizer,
    rows: Sequence[dict[str, Any]],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """Held-out drawing metrics of ``model`` (greedy when ``temperature`` is 0): mean ``reward``,
    ``cell_accuracy`` (the reward's grid part, malformed = 0), ``well_formed``, ``exact_grid``
    and ``caption_f1`` shares, and the ``completions``."""
    model.eval()
    torch.manual_seed(seed)
    completions: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        inputs = tokenizer([row["prompt"] for row in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = (
            dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            if temperature > 0
            else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
        )
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
        for ids in output[:, inputs["input_ids"].shape[1] :].tolist():
            if tokenizer.eos_token_id in ids:
                ids = ids[: ids.index(tokenizer.eos_token_id)]
            completions.append(tokenizer.decode(ids, skip_special_tokens=True))
    batch = RewardBatch(prompts=[r["prompt"] for r in rows], completions=completions, references=[r["references"] for r in rows])
    details = Drawing().details(batch)
    n = max(1, len(rows))
    return {
        "reward": sum(d.score for d in details) / n,
        "cell_accuracy": sum(d.grid for d in details) / n,
        "well_formed": sum(d.reason is None for d in details) / n,
        "exact_grid": sum(d.grid == 1.0 for d in details) / n,
        "caption_f1": sum(d.text for d in details) / n,
        "completions": completions,
    }


def build_drawing_policy(
    cache_dir: str | Path | None = None,
    *,
    size: str = DEFAULT_SIZE,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    batch_size: int = DEFAULT_BATCH_SIZE,
    eval_prompts: int = 128,
    num_threads: int | None = 1,
    force: bool = False,
) -> Path:
    """Build (or fetch from the cache) the warmed-up drawing policy; return its directory.

    Same cache and thread conventions as :func:`polyrl.policies.warmup.build_warm_policy`.
    """
    recipe = WarmupRecipe(
        prefix="draw",
        task="drawing",
        size=size,
        seed=seed,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        eval_prompts=eval_prompts,
        max_new_tokens=MAX_NEW_TOKENS,
        data_version=drawing.SHIPPED.version(),
        model_fingerprint=drawing_fingerprint(size),
        code_version=DRAWING_CODE_VERSION,
    )

    def train() -> tuple[torch.nn.Module, tuple[Any, list[float]]]:
        tokenizer = build_drawing_tokenizer()
        model = build_tiny_causal_lm(tokenizer, size, seed=seed)
        torch.manual_seed(seed)
        train_rows = [{"prompt": row["prompt"], "solution": row["answer"]} for row in drawing.read_rows("train")]
        losses = supervised_finetune(
            model,
            tokenizer,
            train_rows,
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            warmup_steps=min(10, max(1, steps)),
        )
        return model, (tokenizer, losses)

    def finish(folder: Path, model: torch.nn.Module, state: tuple[Any, list[float]]) -> dict[str, Any]:
        tokenizer, losses = state
        test_rows = drawing.read_rows("test")[:eval_prompts]
        greedy = evaluate_drawing(model, tokenizer, test_rows, temperature=0.0, seed=seed)
        sampled = evaluate_drawing(model, tokenizer, test_rows, temperature=1.0, seed=seed)
        save_model_dir(model, tokenizer, folder)
        write_modality_rule(folder, open_marker=IMAGE_OPEN, close_marker=IMAGE_CLOSE, image_tokens=PALETTE_TOKENS)
        return {
            "losses": [round(value, 5) for value in losses],
            "eval_num_prompts": len(test_rows),
            **{f"greedy_{k}": v for k, v in greedy.items() if k != "completions"},
            "sampled_temperature": 1.0,
            **{f"sampled_{k}": v for k, v in sampled.items() if k != "completions"},
            "examples": held_out_examples(test_rows, greedy["completions"], sampled["completions"]),
        }

    return recipe.build(cache_dir, train, finish, num_threads=num_threads, force=force)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build the warmed-up drawing policy and print its record.")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--size", default=DEFAULT_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--lr", type=float, default=DEFAULT_LR)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    path = build_drawing_policy(args.cache_dir, size=args.size, seed=args.seed, steps=args.steps, lr=args.lr, force=args.force)
    record = json.loads((path / INFO_FILE).read_text())
    record.pop("losses")
    print(path)
    print(json.dumps(record, indent=2))
