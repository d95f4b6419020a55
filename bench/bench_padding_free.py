"""What padding-free updates (``train.padding_free``) give: padded vs packed learner updates.

Run: ``python bench/bench_padding_free.py`` (``--sizes 30m`` for one size, ``--rounds 2`` for fewer).

For each policy size and each ``--micro-batches`` size, one synthetic GRPO batch (``--prompts`` ×
``--samples`` rows; prompt and completion lengths drawn as a trained policy's would vary, see
:func:`make_batch`) goes through the learner's update (Dr.GRPO, fp32, the same weights each time,
freed host memory kept as a CPU arm does) with ``padding_free`` off and on, interleaved in one
process, ``--rounds`` times after a warm-up of each. It prints the seconds per update (median),
the ratio, and the share of padding positions the padded forwards compute. Peak memory is
measured for each mode in a fresh interpreter (one update; the growth of the process's peak
resident memory, reset just before the update, over what it held then).

Sizes: ``30m`` (polyrl's tiny Qwen3 of that size, vocabulary 1,000) and ``135m`` (a random Llama
with SmolLM2-135M-Instruct's configuration: 30 layers, hidden 576, 9 heads, 3 key/value heads,
intermediate 1536, vocabulary 49,152, tied embeddings; ``--model PATH`` uses a local HF folder
instead). Ratios of interleaved runs are the figure to read on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from polyrl.algos.objectives import get_objective  # noqa: E402
from polyrl.core.types import Completion  # noqa: E402
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner  # noqa: E402
from polyrl.modeling.logprobs import pack_completions  # noqa: E402
from polyrl.policies.text import MODEL_SIZES  # noqa: E402
from polyrl.rollout.batches import LearnerBatch  # noqa: E402
from polyrl.runtime.host_memory import keep_freed_host_memory  # noqa: E402

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)


def build_policy(size: str, model_path: str | None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if model_path:
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if size == "135m":
        return LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    dims = MODEL_SIZES[size]
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=1000,
            head_dim=dims["hidden_size"] // dims["num_attention_heads"],
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            **dims,
        )
    )


def make_batch(prompts: int, samples: int, max_tokens: int, vocab: int, seed: int = 0) -> LearnerBatch:
    """Prompts of 20–60 tokens (a chat template's length), ``samples`` completions each of
    ``max_tokens/8 .. max_tokens`` tokens, a quarter of them truncated at ``max_tokens``."""
    generator = torch.Generator().manual_seed(seed)
    completions = []
    for _ in range(prompts):
        prompt = torch.randint(5, vocab, (int(torch.randint(20, 61, (), generator=generator)),), generator=generator).tolist()
        for _ in range(samples):
            truncated = bool(torch.rand((), generator=generator) < 0.25)
            n = max_tokens if truncated else int(torch.randint(max(1, max_tokens // 8), max_tokens + 1, (), generator=generator))
            ids = torch.randint(5, vocab, (n,), generator=generator).tolist()
            completions.append(
                Completion(
                    prompt_ids=prompt,
                    completion_ids=ids,
                    text="",
                    sampling_logprobs=[-3.0] * n,
                    finish_reason="length" if truncated else "stop",
                )
            )
    packed = pack_completions(completions, pad_token_id=0)
    advantages = torch.randn(len(completions), generator=generator)[:, None] * packed.response_mask
    return LearnerBatch(packed=packed, old_logprobs=None, advantages=advantages)


def learner(policy: torch.nn.Module, padding_free: bool, micro_batch: int, max_tokens: int) -> PolicyLearner:
    objective = get_objective("dr_grpo")
    # A learning rate of 0: every update starts from the same weights (AdamW still runs).
    settings = LearnerSettings(
        aggregation=objective.default_aggregation,
        learning_rate=1e-12,
        micro_batch_size=micro_batch,
        max_tokens=max_tokens,
        padding_free=padding_free,
    )
    return PolicyLearner(policy, objective, settings)


def padding_share(batch: LearnerBatch, micro_batch: int) -> float:
    """Share of the positions a padded update forwards that are padding (micro-batches of
    length-sorted rows, each cut to its longest row, as the learner does)."""
    lengths = batch.packed.attention_mask.sum(dim=1).sort(descending=True).values
    computed = sum(int(part.max()) * len(part) for part in lengths.split(micro_batch))
    return 1.0 - int(lengths.sum()) / computed


def peak_growth_mib(args: argparse.Namespace, size: str, padding_free: bool, micro_batch: int) -> float:
    """Peak resident memory growth (MiB) of one update in a fresh interpreter."""
    command = [
        sys.executable,
        __file__,
        "--child",
        size,
        "--child-padding-free",
        str(int(padding_free)),
        "--prompts",
        str(args.prompts),
        "--samples",
        str(args.samples),
        "--max-tokens",
        str(args.max_tokens),
        "--micro-batches",
        str(micro_batch),
        "--threads",
        str(torch.get_num_threads()),
    ]
    if args.model:
        command += ["--model", args.model]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_growth_mib"])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(args: argparse.Namespace) -> None:
    policy = build_policy(args.child, args.model)
    batch = make_batch(args.prompts, args.samples, args.max_tokens, policy.config.vocab_size)
    update = learner(policy, bool(args.child_padding_free), int(args.micro_batches), args.max_tokens).update
    # Reset the process's peak resident memory (VmHWM) to what it holds now: writing 5 to
    # clear_refs does that (Linux ≥ 4.0), so the peak read after the update is the update's own.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    update(batch)
    print(json.dumps({"peak_growth_mib": (_status_kib("VmHWM") - before) / 1024}))


def bench_size(args: argparse.Namespace, size: str, micro_batch: int) -> dict[str, float]:
    policy = build_policy(size, args.model)
    batch = make_batch(args.prompts, args.samples, args.max_tokens, policy.config.vocab_size)
    learners = {mode: learner(policy, mode, micro_batch, args.max_tokens) for mode in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds + 1):  # round 0 warms both up
        for mode in (False, True) if round_ % 2 == 0 else (True, False):
            started = time.perf_counter()
            learners[mode].update(batch)
            if round_:
                times[mode].append(time.perf_counter() - started)
    padded, packed = statistics.median(times[False]), statistics.median(times[True])
    memory = {mode: peak_growth_mib(args, size, mode, micro_batch) for mode in (False, True)}
    lengths = batch.packed.attention_mask.sum(dim=1)
    row = {
        "size": size,
        "micro_batch": micro_batch,
        "rows": len(batch.packed),
        "tokens": int(lengths.sum()),
        "padding_share": padding_share(batch, micro_batch),
        "padded_s": padded,
        "packed_s": packed,
        "speedup": padded / packed,
        "padded_peak_mib": memory[False],
        "packed_peak_mib": memory[True],
    }
    print(
        f"{size}: {row['rows']} rows, {row['tokens']} tokens, micro-batches of {micro_batch}: padded forwards compute "
        f"{row['padding_share']:.0%} padding | update padded {padded:.2f} s, packed {packed:.2f} s (×{row['speedup']:.2f}; "
        f"rounds: {', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(times[False], times[True]))}) | peak memory growth padded "
        f"{memory[False]:.0f} MiB, packed {memory[True]:.0f} MiB",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default="30m,135m",
        help="comma-separated: 30m (tiny Qwen3), 135m (SmolLM2-135M's shape), or any of polyrl's model sizes",
    )
    parser.add_argument("--model", default=None, help="a local HF causal-LM folder instead of random weights (one size then)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--micro-batches",
        default="64,16",
        help="comma-separated rows per micro-batch, each measured (64: the whole "
        "batch in one, as the TRL comparison's; 16: train.micro_batch_size's default)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed updates per mode, interleaved, after one warm-up each")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-padding-free", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    keep_freed_host_memory()  # as a CPU learner's arm does (polyrl.runtime.host_memory)
    if args.child:
        child(args)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.prompts}×{args.samples} rows, max {args.max_tokens} "
        f"completion tokens; Dr.GRPO update, fp32",
        flush=True,
    )
    rows = [bench_size(args, size, int(micro)) for size in args.sizes.split(",") for micro in args.micro_batches.split(",")]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
