"""The update's two compute levers alone: forward + backward + fused AdamW, eager on torch's BLAS,
eager with the Linear layers on oneDNN (``train.cpu_matmul: onednn``), and ``torch.compile``.

Run: ``python bench/bench_compile.py`` (``--size 3m``, ``--threads``, ``--steps``).

A policy of ``--size`` (random weights), micro-batches of 16 sequences whose length cycles
through 120/112/104/96 tokens (every step another shape, as in RL), two micro-batches per
optimizer step. The compiled model compiles its decoder the way ``train.compile`` does
(``polyrl.roles.compiled.compile_decoder``, ``dynamic=True``). Reported: the one-off compile
seconds (first step) and the steady tokens/s of each, in one process, with ratios to eager on
torch's BLAS. The compiled model's linears use the library ``train.cpu_matmul: auto`` picks on
this machine (oneDNN as custom ops on a non-Intel CPU, torch's BLAS on Intel), as ``train.compile``
does by default.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from polyrl.models.cache import set_torch_threads  # noqa: E402
from polyrl.models.text import build_random_text_model_dir  # noqa: E402
from polyrl.roles.compiled import compile_decoder  # noqa: E402
from polyrl.roles.cpu_matmul import cpu_vendor, onednn_available, resolve_cpu_matmul, route_linears_through_onednn  # noqa: E402

LENGTHS = (120, 112, 104, 96)


def timed_steps(model: torch.nn.Module, steps: int) -> tuple[float, float]:
    """(first step's seconds, steady tokens/s over the rest)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, fused=True)
    first, seconds, tokens = 0.0, 0.0, 0
    for step in range(steps + 1):
        batch = torch.randint(5, 60, (16, LENGTHS[step % len(LENGTHS)]))
        start = time.perf_counter()
        for _ in range(2):
            logits = model(input_ids=batch).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step == 0:
            first = elapsed
        else:
            seconds, tokens = seconds + elapsed, tokens + 2 * batch.numel()
    return first, tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="30m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    set_torch_threads(args.threads)
    policy = build_random_text_model_dir(Path(tempfile.mkdtemp()) / "policy", size=args.size)
    eager = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).train()
    eager_first, eager_rate = timed_steps(eager, args.steps)
    onednn_rate = None
    if onednn_available():
        routed = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).train()
        route_linears_through_onednn(routed)
        _, onednn_rate = timed_steps(routed, args.steps)
    compiled = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).train()
    library = resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.float32)
    if library == "onednn":
        route_linears_through_onednn(compiled, traceable=True)  # as train.compile does where train.cpu_matmul's auto picks oneDNN
    compile_decoder(compiled, takes_images=False)
    compiled_first, compiled_rate = timed_steps(compiled, args.steps)
    print(f"{args.size} policy, {args.threads} threads, micro-batches 16 × {'/'.join(map(str, LENGTHS))} tokens, "
          f"{args.steps} steady steps")
    print(f"eager     first step {eager_first:6.1f} s   steady {eager_rate:8,.0f} tok/s   (torch's BLAS)")
    if onednn_rate is not None:
        print(f"oneDNN    eager linears                steady {onednn_rate:8,.0f} tok/s   ×{onednn_rate / eager_rate:.2f}")
    print(f"compiled  first step {compiled_first:6.1f} s   steady {compiled_rate:8,.0f} tok/s   ×{compiled_rate / eager_rate:.2f}"
          f"   (linears: {library}, train.cpu_matmul auto's choice on this {cpu_vendor() or 'unknown'} CPU)")


if __name__ == "__main__":
    main()
