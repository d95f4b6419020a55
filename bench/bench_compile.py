"""The update's two compute levers alone: forward + backward + fused AdamW, eager on torch's BLAS,
eager with the Linear layers on oneDNN (``train.cpu_matmul: onednn``), and ``torch.compile``.

Run: ``python bench/bench_compile.py`` (``--size 3m``, ``--threads``, ``--steps``).

A policy of ``--size`` (random weights), micro-batches of 16 sequences whose length cycles
through 120/112/104/96 tokens (every step another shape, as in RL), two micro-batches per
optimizer step. The compiled model compiles its decoder the way ``train.compile`` does
(``polyrl.runtime.compiled.compile_decoder_layers``: each layer, ``dynamic=True``). Reported: the one-off compile
seconds (a warm-up step per shape, every compilation included) and the steady tokens/s of each, in
one process, the models' steps interleaved round by round, with the median per-round ratio to eager
on torch's BLAS. The compiled model's linears use the library ``train.cpu_matmul: auto`` picks on
this machine (oneDNN as custom ops on a non-Intel CPU, torch's BLAS on Intel), as ``train.compile``
does by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from polyrl.policies.text import build_random_text_model_dir  # noqa: E402
from polyrl.runtime.compiled import compile_decoder_layers  # noqa: E402
from polyrl.runtime.cpu_matmul import cpu_vendor, onednn_available, resolve_cpu_matmul, route_linears_through_onednn  # noqa: E402
from polyrl.runtime.threads import set_torch_threads  # noqa: E402

LENGTHS = (120, 112, 104, 96)


class Arm:
    """One model with its optimizer; :meth:`step` runs one optimizer step of two micro-batches."""

    def __init__(self, name: str, model: torch.nn.Module):
        self.name, self.model = name, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, fused=True)
        self.rates: list[float] = []  # tokens/s per timed step

    def step(self, index: int) -> float:
        batch = torch.randint(5, 60, (16, LENGTHS[index % len(LENGTHS)]))
        start = time.perf_counter()
        for _ in range(2):
            logits = self.model(input_ids=batch, use_cache=False).logits  # as the learner: a KV cache would recompile per layer
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="30m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="Timed steps per model, interleaved round by round.")
    args = parser.parse_args()
    set_torch_threads(args.threads)
    policy = build_random_text_model_dir(Path(tempfile.mkdtemp()) / "policy", size=args.size)

    def load() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).train()

    arms = [Arm("eager", load())]
    if onednn_available():
        routed = load()
        route_linears_through_onednn(routed)
        arms.append(Arm("oneDNN", routed))
    compiled = load()
    library = resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.float32)
    if library == "onednn":
        route_linears_through_onednn(compiled, traceable=True)  # as train.compile does where train.cpu_matmul's auto picks oneDNN
    compile_decoder_layers(compiled, takes_images=False)
    arms.append(Arm("compiled", compiled))
    # Warm-up: one step per shape, so every (re)compilation happens before the timed rounds.
    first = {arm.name: sum(arm.step(index) for index in range(len(LENGTHS))) for arm in arms}
    # Rounds interleave the models, so a machine whose speed drifts slows them alike.
    for index in range(args.steps):
        for arm in arms:
            arm.rates.append(2 * 16 * LENGTHS[index % len(LENGTHS)] / arm.step(index))
    eager = arms[0]
    print(
        f"{args.size} policy, {args.threads} threads, micro-batches 16 × {'/'.join(map(str, LENGTHS))} tokens, "
        f"{args.steps} timed steps each, interleaved"
    )
    for arm in arms:
        ratios = [rate / base for rate, base in zip(arm.rates, eager.rates)]
        note = {
            "eager": "(torch's BLAS)",
            "oneDNN": "(eager, linears on oneDNN)",
            "compiled": f"(linears: {library}, train.cpu_matmul auto's choice on this {cpu_vendor() or 'unknown'} CPU)",
        }[arm.name]
        print(
            f"{arm.name:9} warm-up {first[arm.name]:6.1f} s   steady {statistics.median(arm.rates):8,.0f} tok/s   "
            f"×{statistics.median(ratios):.2f} (per round {min(ratios):.2f}–{max(ratios):.2f})   {note}"
        )


if __name__ == "__main__":
    main()
