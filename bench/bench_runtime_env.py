"""Process-level levers on this CPU: allocator/OpenMP preloads and torch thread counts.

Run: ``python bench/bench_runtime_env.py`` (``--size 3m`` for a smaller policy, ``--rounds``).

vLLM's CPU backend recommends preloading tcmalloc and Intel OpenMP (``LD_PRELOAD``); they can
only take effect at process start, so each variant runs in its own child process. Variants:

* ``default``: nothing preloaded (torch's GNU OpenMP, glibc malloc);
* ``tcmalloc``: ``libtcmalloc_minimal.so.4`` (Debian package ``libtcmalloc-minimal4``);
* ``iomp``: ``libiomp5.so`` (the ``intel-openmp`` wheel in the venv, if present);
* ``tcmalloc+iomp``: both, as vLLM's CPU guide sets them.

Each child does the two kinds of work of an RL step at ``--size`` (random weights): vLLM
generation (in-process engine, ``--seqs`` sequences × ``--new-tokens`` tokens, EOS ignored) and a
learner update (forward + backward + AdamW over the same number of sequences in micro-batches of
16), at every thread count of ``--threads``. Variants alternate for ``--rounds`` rounds so machine
noise hits all alike; the medians are printed with the ratio to ``default``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_MARK = "BENCH_RESULT "
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
IOMP = str(Path(sys.prefix) / "lib" / "libiomp5.so")


def variants() -> dict[str, list[str]]:
    found = {"default": []}
    if Path(TCMALLOC).exists():
        found["tcmalloc"] = [TCMALLOC]
    if Path(IOMP).exists():
        found["iomp"] = [IOMP]
    if len(found) == 3:
        found["tcmalloc+iomp"] = [TCMALLOC, IOMP]
    return found


def child(policy: str, seqs: int, new_tokens: int, thread_counts: list[int]) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from polyrl.engines.vllm_engine import VLLMRolloutEngine
    from polyrl.runtime.threads import set_torch_threads

    engine = VLLMRolloutEngine(policy, kv_cache_gb=1.0, max_model_len=512)
    prompts = [TokensPrompt(prompt_token_ids=[5 + (i % 40), 7, 9 + (i % 13)]) for i in range(seqs)]
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, seed=0)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).train()
    model.config.use_cache = False
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, fused=True)
    batch = torch.randint(5, 60, (seqs, new_tokens + 3))
    out: dict[str, float] = {}
    for threads in thread_counts:
        set_torch_threads(threads)
        engine.llm.generate(prompts[:8], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        made = sum(len(o.outputs[0].token_ids) for o in outs)
        out[f"generate_tok_s@{threads}"] = made / (time.perf_counter() - start)
        for timed in (False, True):  # first pass warms the allocator and kernels
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for micro in torch.split(batch, 16):
                logits = model(input_ids=micro).logits
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), micro[:, 1:].reshape(-1))
                loss.backward()
            optimizer.step()
            if timed:
                out[f"update_tok_s@{threads}"] = batch.numel() / (time.perf_counter() - start)
    engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="30m")
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=None, help="A subset of: default tcmalloc iomp tcmalloc+iomp.")
    parser.add_argument("--child", nargs=2, metavar=("POLICY", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child[0], args.seqs, args.new_tokens, args.threads)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from polyrl.policies.text import build_random_text_model_dir

    policy = str(build_random_text_model_dir(Path(tempfile.mkdtemp()) / "policy", size=args.size))
    found = {name: libs for name, libs in variants().items() if not args.variants or name in args.variants}
    results: dict[str, list[dict]] = {name: [] for name in found}
    for round_index in range(args.rounds):
        for name, libraries in found.items():
            env = dict(os.environ)
            if libraries:
                env["LD_PRELOAD"] = ":".join(libraries + ([env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else []))
            command = [
                sys.executable,
                __file__,
                "--child",
                policy,
                name,
                "--seqs",
                str(args.seqs),
                "--new-tokens",
                str(args.new_tokens),
                "--threads",
                *map(str, args.threads),
            ]
            done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.mkdtemp())
            line = next((row for row in done.stdout.splitlines() if row.startswith(RESULT_MARK)), None)
            if line is None:
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
                print(f"round {round_index + 1} {name}: failed: {tail[-600:]}")
                continue
            results[name].append(json.loads(line[len(RESULT_MARK) :]))
            print(f"round {round_index + 1} {name}: {results[name][-1]}", flush=True)

    print(f"\n{args.size} policy, {args.seqs} sequences x {args.new_tokens} tokens, median of {args.rounds} interleaved rounds")
    base = results.get("default") or []
    keys = sorted({k for runs in results.values() for r in runs for k in r})
    print(f"{'variant':<16}" + "".join(f"{k:>22}" for k in keys))
    for name, runs in results.items():
        if not runs:
            continue
        cells = []
        for key in keys:
            value = statistics.median(r[key] for r in runs)
            ratio = value / statistics.median(r[key] for r in base) if base else float("nan")
            cells.append(f"{value:>12,.0f} (x{ratio:4.2f})")
        print(f"{name:<16}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
