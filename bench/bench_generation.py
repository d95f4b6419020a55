"""Generation throughput: vLLM vs transformers, and the polyrl vLLM wrapper vs bare ``llm.generate``.

Run: ``python bench/bench_generation.py`` (add ``--quick`` for a smaller smoke run).

Part 1, engines side by side, per model size ("0.3m", "30m"; random weights, char tokenizer):
128 sequences x 64 new tokens each (EOS ignored so every sequence makes exactly 64 tokens),
tokens/s for HF ``generate`` in bf16 and fp32 and for vLLM (in-process engine, fp32 unless
``--vllm-dtype``). HF runs first: an in-process vLLM engine pins torch to fewer threads for
the rest of the process.

Part 2, wrapper overhead on the 30m model: ``VLLMRolloutEngine.generate`` (token-id prompts,
per-request seeds, processed log-probs, Completion objects) vs bare ``llm.generate`` with the
same prompts, seeds and sampling settings but no log-probs and no post-processing, 8 prompts x
8 samples x up to 64 tokens. The two calls sample identical tokens (same seeds), so the work is
the same; reported as the ratio of tokens/s (target >= 0.90). Runs alternate and the median of
``--repeats`` is reported, after a warm-up of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault(
    "VLLM_CONFIGURE_LOGGING", "0"
)  # vLLM's INFO lines (its whole engine config, per engine) would bury the figures
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from polyrl.policies.text import build_char_tokenizer, build_tiny_qwen2, count_parameters, save_model_dir  # noqa: E402

PROMPT_TEXTS = [f"{a}+{b}=" for a in range(16) for b in range(8)]  # 128 distinct short prompts


def bench_hf(model, tokenizer, dtype: torch.dtype, n_seqs: int, new_tokens: int, repeats: int) -> float:
    model = model.to(dtype).eval()
    batch = tokenizer(PROMPT_TEXTS[:n_seqs], return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    rates = []
    with torch.no_grad():
        model.generate(**batch, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(**batch, **kwargs)
            elapsed = time.perf_counter() - start
            made = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
            rates.append(made / elapsed)
    return statistics.median(rates)


def bench_vllm(engine, tokenizer, n_seqs: int, new_tokens: int, repeats: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=tokenizer(t, add_special_tokens=False)["input_ids"]) for t in PROMPT_TEXTS[:n_seqs]]
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, seed=0)
    engine.llm.generate(prompts, params, use_tqdm=False)  # warm-up (same shapes)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    return statistics.median(rates)


def bench_wrapper(engine, n_prompts: int, n_samples: int, new_tokens: int, repeats: int) -> tuple[float, float, int]:
    from vllm import SamplingParams

    from polyrl.core.types import PromptSample, SamplingSettings

    prompts = [PromptSample(prompt=t) for t in PROMPT_TEXTS[:n_prompts]]
    settings = SamplingSettings(n=n_samples, temperature=1.0, max_tokens=new_tokens, seed=7)
    inputs, params, _ = engine.build_requests(prompts, settings)
    # Bare: the same prompts and seeds, no log-probs, default output handling.
    bare_params = [
        SamplingParams(n=p.n, temperature=p.temperature, top_p=p.top_p, top_k=0, max_tokens=p.max_tokens, seed=p.seed)
        for p in params
    ]

    def run_wrapper() -> int:
        return sum(len(c.completion_ids) for g in engine.generate(prompts, settings) for c in g)

    def run_bare() -> int:
        outs = engine.llm.generate(inputs, bare_params, use_tqdm=False)
        return sum(len(s.token_ids) for o in outs for s in o.outputs)

    run_wrapper(), run_bare()  # warm-up
    wrapper_rates, bare_rates, tokens = [], [], 0
    for _ in range(repeats):
        for fn, rates in ((run_bare, bare_rates), (run_wrapper, wrapper_rates)):
            start = time.perf_counter()
            tokens = fn()
            rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(wrapper_rates), statistics.median(bare_rates), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.3m", "30m"])
    parser.add_argument("--seqs", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--quick", action="store_true", help="32 sequences x 16 tokens, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.seqs, args.new_tokens, args.repeats = 32, 16, 1

    from polyrl.engines.base import build_rollout_engine

    tokenizer = build_char_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="polyrl_bench_gen_"))
    rows: list[tuple[str, str, str, float]] = []
    params: dict[str, int] = {}
    dirs: dict[str, Path] = {}
    threads_hf = torch.get_num_threads()
    for size in args.sizes:
        model = build_tiny_qwen2(tokenizer, size, seed=0)
        params[size] = count_parameters(model)
        dirs[size] = save_model_dir(model, tokenizer, workdir / size)
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            rate = bench_hf(build_tiny_qwen2(tokenizer, size, seed=0), tokenizer, dtype, args.seqs, args.new_tokens, args.repeats)
            rows.append((size, f"HF generate {name}", f"{threads_hf} threads", rate))
            print(f"  {size} HF {name}: {rate:,.0f} tok/s", flush=True)

    wrapper_result = None
    for size in args.sizes:
        engine = build_rollout_engine("vllm", str(dirs[size]), dtype=args.vllm_dtype, kv_cache_gb=1.0, max_model_len=256)
        try:
            rate = bench_vllm(engine, tokenizer, args.seqs, args.new_tokens, args.repeats)
            rows.append((size, f"vLLM {args.vllm_dtype}", f"{torch.get_num_threads()} threads", rate))
            print(f"  {size} vLLM: {rate:,.0f} tok/s", flush=True)
            if size == args.sizes[-1]:
                wrapper_result = (size, *bench_wrapper(engine, 8, 8, args.new_tokens, max(args.repeats, 3)))
        finally:
            engine.close()

    print(f"\n{args.seqs} sequences x {args.new_tokens} new tokens (EOS ignored), median of {args.repeats}")
    print(f"{'model':>6} {'params':>11}  {'engine':<18} {'threads':<11} {'tokens/s':>10}")
    for size, engine_name, threads, rate in rows:
        print(f"{size:>6} {params[size]:>11,}  {engine_name:<18} {threads:<11} {rate:>10,.0f}")
    if wrapper_result:
        size, wrapper_rate, bare_rate, tokens = wrapper_result
        print(f"\nwrapper vs bare vLLM ({size}, 8 prompts x 8 samples x <= {args.new_tokens} tokens, {tokens} tokens/call)")
        print(f"  bare llm.generate        {bare_rate:>10,.0f} tok/s")
        print(f"  VLLMRolloutEngine        {wrapper_rate:>10,.0f} tok/s")
        print(f"  ratio wrapper/bare       {wrapper_rate / bare_rate:>10.3f}  (target >= 0.90)")


if __name__ == "__main__":
    main()
