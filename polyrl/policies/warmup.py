"""The warmed-up base policy: a tiny Qwen3-architecture model taught the arithmetic task by a short supervised run.

RL needs a policy that is *sometimes* right: a random model never earns a reward, a perfect
one leaves nothing to learn. ``build_warm_policy`` builds the character tokenizer and a tiny
Qwen3 from config, fine-tunes it for a few hundred AdamW steps on the train split of the
shipped arithmetic task (loss on solution tokens + EOS only), measures held-out accuracy, and
saves a Hugging Face model directory (safetensors + tokenizer) that
``AutoModelForCausalLM.from_pretrained`` and vLLM load.

The directory lives at ``cache_dir/<key>/`` where ``key`` hashes every input that changes the
result (size, seed, steps, lr, batch size, schedule, eval settings, the shipped data's hash and
``WARMUP_CODE_VERSION``): the :class:`~polyrl.policies.recipe.WarmupRecipe` the three built-in
families share. It is written to a temporary directory and renamed into place with a
completion marker, so a crashed or concurrent build never leaves a half-written model that a
later call would return. A complete directory is returned as is.

Beside the weights, ``polyrl_warmup.json`` records the build: held-out greedy and sampled
(temperature 1.0) accuracy, mean completion lengths, share of long (step-by-step) completions,
parameter count, steps, seconds, and the loss curve; read it with ``warm_policy_info``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import RolloutEngine
from polyrl.engines.hf_engine import HFRolloutEngine
from polyrl.policies import text as text_models
from polyrl.policies.cache import (  # noqa: F401 - COMPLETE_MARKER, default_cache_dir: importers of this module
    COMPLETE_MARKER,
    INFO_FILE,
    default_cache_dir,
    held_out_examples,
)
from polyrl.policies.recipe import WarmupRecipe, supervised_steps
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm, save_model_dir
from polyrl.rewards.base import RewardBatch
from polyrl.rewards.builtins.accuracy import Accuracy
from polyrl.rewards.summary import accuracy_share, length_stats
from polyrl.tasks import arithmetic

# Bump when a change here alters the weights or the recorded info of a build.
WARMUP_CODE_VERSION = "2"

DEFAULT_SIZE = "0.3m"
DEFAULT_STEPS = 400
DEFAULT_LR = 5e-3
DEFAULT_BATCH_SIZE = 32


_read_rows = arithmetic.read_rows


def model_fingerprint(size: str, extra_tokens: Sequence[str] = ()) -> str:
    """A hash of what defines the untrained model: its size entry, vocabulary (the character
    tokenizer's, plus ``extra_tokens``) and builder code.

    Part of the cache key, so a change of architecture or tokenizer in ``text_models`` (e.g.
    Qwen2 -> Qwen3) can never return a stale cached policy.
    """
    if size not in text_models.MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; allowed: {sorted(text_models.MODEL_SIZES)}")
    payload = json.dumps(
        {
            "size": text_models.MODEL_SIZES[size],
            "vocab": text_models.SPECIAL_TOKENS + text_models.CHARACTERS + list(extra_tokens),
            "builder": inspect.getsource(build_tiny_causal_lm),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _length_bucketed_batches(
    encoded: Sequence[tuple[list[int], list[int]]], *, batch_size: int, seed: int, bucket_batches: int
) -> Iterator[list[int]]:
    """Endless batches of row indices: seeded shuffle per epoch, grouped by length in pools."""
    rng = random.Random(f"polyrl-warmup-order-{seed}")
    stream: list[int] = []
    pool_size = batch_size * max(1, bucket_batches)
    while True:
        while len(stream) < pool_size:
            epoch = list(range(len(encoded)))
            rng.shuffle(epoch)
            stream.extend(epoch)
        pool, stream = stream[:pool_size], stream[pool_size:]
        pool.sort(key=lambda i: len(encoded[i][0]) + len(encoded[i][1]))
        chunks = [pool[start : start + batch_size] for start in range(0, pool_size, batch_size)]
        rng.shuffle(chunks)
        yield from chunks


def _pack_batch(
    examples: Sequence[tuple[list[int], list[int]]], *, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack ``(prompt_ids, solution_ids)`` examples into few rows (first-fit decreasing).

    Padding every example to the longest one would waste about half the compute (a short
    solution is ~4x shorter than a long one). Each row holds several examples; a block-diagonal
    causal mask (4D, additive) keeps them from seeing each other and position ids restart at 0
    for each, so every example is trained exactly as if it were alone. Returns ``input_ids``,
    ``labels`` (-100 on prompts and padding), ``position_ids`` and the 4D float mask.
    """
    lengths = [len(p) + len(s) for p, s in examples]
    capacity = max(lengths)
    rows: list[list[int]] = []  # example indices per row
    room: list[int] = []
    for index in sorted(range(len(examples)), key=lambda i: (-lengths[i], i)):
        for row, free in enumerate(room):
            if free >= lengths[index]:
                rows[row].append(index)
                room[row] -= lengths[index]
                break
        else:
            rows.append([index])
            room.append(capacity - lengths[index])
    width = max(capacity - free for free in room)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    for r, members in enumerate(rows):
        offset = 0
        for member in members:
            prompt_ids, solution_ids = examples[member]
            ids = prompt_ids + solution_ids
            end = offset + len(ids)
            input_ids[r, offset:end] = torch.tensor(ids)
            labels[r, offset + len(prompt_ids) : end] = torch.tensor(solution_ids)
            position_ids[r, offset:end] = torch.arange(len(ids))
            segment[r, offset:end] = member
            offset = end
        # Padding: each pad token is its own segment, so it attends only to itself (no NaNs).
        segment[r, offset:] = -2 - torch.arange(width - offset)
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return input_ids, labels, position_ids, mask[:, None]


def supervised_finetune(
    model: torch.nn.Module,
    tokenizer,
    rows: Sequence[dict[str, Any]],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    warmup_steps: int = 10,
    min_lr_ratio: float = 1.0,
    weight_decay: float = 0.01,
    bucket_batches: int = 1,
    on_step: Callable[[int, float, torch.nn.Module], None] | None = None,
) -> list[float]:
    """Train ``model`` on ``prompt + solution + EOS`` (loss on solution and EOS only).

    Rows are visited in a seeded shuffled order, epoch after epoch; each run of
    ``bucket_batches`` batches can be grouped by length (off by default: batches of only short
    or only long solutions swing the policy's form preference), and each batch is packed into
    rows (``_pack_batch``); the steps are the shared warm-up loop
    (:func:`polyrl.policies.recipe.supervised_steps`). ``on_step(step, loss, model)`` is called
    after every update. Returns the loss of every step.
    """
    encoded = []
    for row in rows:
        prompt_ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        solution_ids = tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((prompt_ids, solution_ids))
    order = _length_bucketed_batches(encoded, batch_size=batch_size, seed=seed, bucket_batches=bucket_batches)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        for indices in order:
            input_ids, labels, position_ids, attention_mask = _pack_batch(
                [encoded[i] for i in indices], pad_token_id=tokenizer.pad_token_id
            )
            yield {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "labels": labels}

    return supervised_steps(
        model,
        batches(),
        steps=steps,
        lr=lr,
        warmup_steps=warmup_steps,
        min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay,
        on_step=on_step,
    )


def _is_long_form(completion: str) -> bool:
    head = completion.split("####")[0]
    return arithmetic.LONG_MARKER in head or "=" in head


def evaluate_arithmetic(
    engine: RolloutEngine,
    rows: Sequence[dict[str, Any]],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 48,
    seed: int = 0,
) -> dict[str, Any]:
    """Accuracy of ``engine``'s policy on arithmetic ``rows`` (greedy when ``temperature`` is 0).

    The same path as training and the eval harness: the rollout engine samples (pure sampling:
    top_k=0, top_p=1), the ``accuracy`` reward (``extract: hash``) scores and
    :func:`accuracy_share` is the accuracy. Returns ``{"accuracy", "mean_length",
    "long_fraction", "truncated_fraction", "completions"}``; lengths are in tokens and include
    the EOS token when one was produced.
    """
    if not rows:
        return {"accuracy": float("nan"), "mean_length": 0.0, "long_fraction": 0.0, "truncated_fraction": 0.0, "completions": []}
    settings = SamplingSettings(n=1, temperature=temperature, max_tokens=max_new_tokens, seed=seed)
    samples = [group[0] for group in engine.generate([PromptSample(prompt=row["prompt"]) for row in rows], settings)]
    texts = [sample.text for sample in samples]
    scores = Accuracy(extract="hash").score(
        RewardBatch(
            prompts=[row["prompt"] for row in rows], completions=texts, fields=[{"answer": row["answer"]} for row in rows]
        )
    )
    lengths = length_stats([len(s.completion_ids) for s in samples], [s.finish_reason == "length" for s in samples])
    return {
        "accuracy": accuracy_share(scores),
        "mean_length": lengths["mean"],
        "long_fraction": sum(_is_long_form(text) for text in texts) / len(rows),
        "truncated_fraction": lengths["truncated_share"],
        "completions": texts,
    }


def build_warm_policy(
    cache_dir: str | Path | None = None,
    *,
    size: str = DEFAULT_SIZE,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    batch_size: int = DEFAULT_BATCH_SIZE,
    warmup_steps: int = 10,
    eval_prompts: int = 128,
    max_new_tokens: int = 48,
    num_threads: int | None = 1,
    force: bool = False,
) -> Path:
    """Build (or fetch from the cache) the warmed-up arithmetic policy; return its directory.

    ``cache_dir`` defaults to ``default_cache_dir()``. ``num_threads`` caps torch's CPU threads
    during the build (restored afterwards); ``None`` leaves them alone. One thread is the
    default: on matrices ~100 wide, intra-op parallelism costs more in synchronisation than it
    saves, and collapses when another process holds a core. ``force`` rebuilds even when a
    complete directory exists. Deterministic for given inputs.
    """
    recipe = WarmupRecipe(
        prefix="arith",
        task="arithmetic",
        size=size,
        seed=seed,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        warmup_steps=warmup_steps,
        eval_prompts=eval_prompts,
        max_new_tokens=max_new_tokens,
        data_version=arithmetic.SHIPPED.version(),
        model_fingerprint=model_fingerprint(size),
        code_version=WARMUP_CODE_VERSION,
    )

    def train() -> tuple[torch.nn.Module, tuple[Any, list[float]]]:
        tokenizer = build_char_tokenizer()
        model = build_tiny_causal_lm(tokenizer, size, seed=seed)
        torch.manual_seed(seed)
        losses = supervised_finetune(
            model,
            tokenizer,
            _read_rows("train"),
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            warmup_steps=min(warmup_steps, max(1, steps)),
        )
        return model, (tokenizer, losses)

    def finish(folder: Path, model: torch.nn.Module, state: tuple[Any, list[float]]) -> dict[str, Any]:
        tokenizer, losses = state
        test_rows = _read_rows("test")[:eval_prompts]
        save_model_dir(model, tokenizer, folder)
        # The engine samples from the model in memory; the directory gives it the model's own
        # declarations (modality rule, processor), as for any policy directory.
        with HFRolloutEngine(str(folder), model=model, tokenizer=tokenizer, seed=seed, device="cpu", batch_size=128) as engine:
            greedy = evaluate_arithmetic(engine, test_rows, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed)
            sampled = evaluate_arithmetic(engine, test_rows, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
        return {
            "num_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "losses": [round(value, 5) for value in losses],
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "eval_num_prompts": len(test_rows),
            "greedy_accuracy": greedy["accuracy"],
            "greedy_mean_length": greedy["mean_length"],
            "greedy_long_fraction": greedy["long_fraction"],
            "greedy_truncated_fraction": greedy["truncated_fraction"],
            "sampled_temperature": 1.0,
            "sampled_accuracy": sampled["accuracy"],
            "sampled_mean_length": sampled["mean_length"],
            "sampled_long_fraction": sampled["long_fraction"],
            "sampled_truncated_fraction": sampled["truncated_fraction"],
            "examples": held_out_examples(test_rows, greedy["completions"], sampled["completions"]),
        }

    return recipe.build(cache_dir, train, finish, num_threads=num_threads, force=force)


def warm_policy_info(path: str | Path) -> dict[str, Any]:
    """The build record written beside the weights of a warmed-up policy."""
    info_path = Path(path) / INFO_FILE
    if not info_path.is_file():
        raise FileNotFoundError(f"{path} is not a polyrl warm-up directory (no {INFO_FILE})")
    return json.loads(info_path.read_text())


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build the warmed-up arithmetic policy and print its record.")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--size", default=DEFAULT_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--lr", type=float, default=DEFAULT_LR)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    path = build_warm_policy(
        args.cache_dir,
        size=args.size,
        seed=args.seed,
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        num_threads=args.num_threads,
        force=args.force,
    )
    record = warm_policy_info(path)
    record.pop("losses")
    print(path)
    print(json.dumps(record, indent=2))
