"""Where an RL step's time goes, and how close the update is to the machine's matmul peak.

Run: ``python bench/bench_step.py`` (``--size 3m`` for a smaller policy, ``--quick`` for fewer
steps, ``--demo`` to add the demo config's warm policy).

For a policy of ``--size`` (random weights, so nearly every sample runs to the token limit),
``--prompts`` × ``--samples`` × ``--max-tokens`` per step, Dr.GRPO, vLLM engine, fp32 (or
``--dtype bfloat16``: the update against the bf16 matmul peak), it prints:

* per phase (generate, score, advantage, update, sync, log): mean seconds and share of the step,
  samples/s, and orchestration overhead (time outside generate/score/update; goal < 5 %);
* for the update: the useful work, 6 × parameters × real (unpadded) tokens forwarded, its achieved
  GFLOP/s against the machine's fp32 matmul peak measured in the same process at the same thread
  count (``bench/bench_matmul.py``, every learner shape and library before and after the steps),
  the share of computed token positions that are padding, and the optimizer's share of the update;
* the update's own oneDNN products timed where they run (``train.cpu_matmul`` → oneDNN): their share
  of the update and of the peak, which is the update's ceiling if nothing else took time;
* the same share step by step against a peak probe run right before and right after each step
  (the fastest product of that table, ~1 s each): on a machine whose speed drifts by ±30% within
  minutes, a ratio of two measurements seconds apart is the steadier figure;
* the rollout phase against bare ``llm.generate`` of the same prompts, seeds and settings.

Counting is done by a forward pre-hook on the policy, so it measures whatever the learner does
(one forward per micro-batch, padding trimmed or not). On a loaded machine every figure moves
with the load: compare ratios of runs interleaved with each other.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's INFO lines would bury the tables
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_matmul import available_libraries, gflops, learner_shapes, measure, measure_peaks, torch_threads  # noqa: E402

from polyrl.config.schema import load_experiment, resolve_arms  # noqa: E402
from polyrl.runtime.cpu_matmul import linear_library, timed_products  # noqa: E402
from polyrl.runtime.precision import compute_dtype  # noqa: E402
from polyrl.trainer.build_arm import build_arm  # noqa: E402
from polyrl.trainer.loop import PHASES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class UpdateCounter:
    """Token positions the policy computes during the update, and the optimizer's time."""

    active: bool = False
    computed: int = 0  # rows × columns of every forward
    real: int = 0  # attention-mask ones of every forward
    forwards: int = 0
    optimizer_s: float = 0.0
    page_faults: int = 0  # minor faults of this process during the update (fresh pages from the kernel)
    products_s: float = 0.0  # the update's own oneDNN products, timed where they run (cpu_matmul.timed_products)
    products_gflop: float = 0.0

    def reset(self) -> None:
        self.computed = self.real = self.forwards = self.page_faults = 0
        self.optimizer_s = self.products_s = self.products_gflop = 0.0


def instrument(arm) -> UpdateCounter:
    counter = UpdateCounter()
    policy, learner = arm.learner.policy, arm.learner

    def count(_module, args, kwargs):
        if counter.active:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            counter.computed += int(ids.numel())
            counter.real += int(mask.sum()) if mask is not None else int(ids.numel())
            counter.forwards += 1

    decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else policy
    decoder.register_forward_pre_hook(count, with_kwargs=True)
    update, optimizer_step = learner.update, learner.optimizer.step

    def counted_update(*args, **kwargs):
        counter.active = True
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        try:
            with timed_products() as products:
                return update(*args, **kwargs)
        finally:
            counter.active = False
            counter.page_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            counter.products_s += products.seconds
            counter.products_gflop += products.flop / 1e9

    def timed_step(*args, **kwargs):
        start = time.perf_counter()
        try:
            return optimizer_step(*args, **kwargs)
        finally:
            counter.optimizer_s += time.perf_counter() - start

    learner.update = counted_update
    learner.optimizer.step = timed_step
    return counter


def run_steps(loop, counter: UpdateCounter, steps: int, warmup: int = 1, probe=None) -> list[dict[str, float]]:
    """``steps`` timed steps after ``warmup`` untimed ones; ``probe()`` (GFLOP/s) runs around each."""
    for _ in range(warmup):  # first-call costs (allocator, kernels, torch.compile) are not steady state
        loop.step()
    history = []
    for _ in range(steps):
        counter.reset()
        before = probe() if probe else float("nan")
        metrics = loop.step()
        after = probe() if probe else float("nan")
        history.append(
            {
                **metrics,
                "bench/computed": counter.computed,
                "bench/real": counter.real,
                "bench/forwards": counter.forwards,
                "bench/optimizer_s": counter.optimizer_s,
                "bench/page_faults": counter.page_faults,
                "bench/peak_before": before,
                "bench/peak_after": after,
                "bench/products_s": counter.products_s,
                "bench/products_gflop": counter.products_gflop,
            }
        )
    return history


def peak_probe(size: str, tokens: int, threads: int, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The peak table (every learner product and the square, per library) on ``device`` and its fastest
    learner product as a ~1 s GFLOP/s probe: (probe, its label, best GFLOP/s per library)."""
    tables = {
        library: measure(size, tokens, threads, library=library, dtype=dtype, device=device)
        for library in available_libraries(dtype, device)
    }
    _, library, name = max(
        (rate, library, name)
        for library, table in tables.items()
        for name, rate in table.items()
        if not name.startswith("square")
    )
    m, k, n = next((m, k, n) for shape, m, k, n in learner_shapes(size, tokens) if shape == name)

    def probe() -> float:
        with torch_threads(threads):
            return gflops(m, k, n, library=library, seconds=0.3, dtype=dtype, device=device)

    return probe, f"{name} ({m}×{k} @ {k}×{n}) on {library}", {library: max(table.values()) for library, table in tables.items()}


def phase_table(title: str, history: list[dict[str, float]]) -> dict[str, float]:
    means = {phase: statistics.mean(h[f"perf/{phase}_s"] for h in history) for phase in PHASES}
    step = statistics.mean(sum(h[f"perf/{phase}_s"] for phase in PHASES) for h in history)
    samples = statistics.mean(h["rollout/samples"] for h in history)
    overhead = step - means["generate"] - means["score"] - means["update"]
    print(f"\n## {title}\n")
    print("| phase | s/step | share |\n|---|---|---|")
    for phase in PHASES:
        print(f"| {phase} | {means[phase]:.3f} | {means[phase] / step:.1%} |")
    print(f"| **step** | **{step:.3f}** | 100% |")
    print(
        f"\nsamples/step {samples:.0f} · samples/s {samples / step:.2f} · "
        f"orchestration overhead (outside generate/score/update) {overhead / step:.1%} · "
        f"mean response length {statistics.mean(h['rollout/response_length/mean'] for h in history):.1f} tokens"
    )
    return {"step_s": step, "samples_per_s": samples / step, "overhead_share": overhead / step, **means}


def update_report(
    history: list[dict[str, float]], parameters: int, peak_gflops: float, dtype: str = "float32"
) -> dict[str, float]:
    update_s = statistics.mean(h["perf/update_s"] for h in history)
    real = statistics.mean(h["bench/real"] for h in history)
    computed = statistics.mean(h["bench/computed"] for h in history)
    useful_gflop = 6 * parameters * real / 1e9
    achieved = useful_gflop / update_s
    optimizer = statistics.mean(h["bench/optimizer_s"] for h in history)
    print(
        f"\nupdate: {update_s:.3f} s for {useful_gflop:.1f} GFLOP of useful work (6 × {parameters / 1e6:.2f}M params × "
        f"{real:.0f} real tokens) = **{achieved:.1f} GFLOP/s**, {achieved / peak_gflops:.0%} of the measured {dtype} matmul peak "
        f"{peak_gflops:.1f} GFLOP/s at {torch.get_num_threads()} threads (target ≥ 75%)"
    )
    per_step = [
        6 * parameters * h["bench/real"] / 1e9 / h["perf/update_s"] / ((h["bench/peak_before"] + h["bench/peak_after"]) / 2)
        for h in history
        if h["bench/peak_before"] == h["bench/peak_before"]
    ]  # NaN: no probe ran
    if per_step:
        print(
            f"step by step, against the peak probe right around each step: median **{statistics.median(per_step):.0%}** of peak "
            f"(steps {', '.join(f'{share:.0%}' for share in per_step)}; probes "
            f"{', '.join('{:.0f}/{:.0f}'.format(h['bench/peak_before'], h['bench/peak_after']) for h in history)} GFLOP/s before/after)"
        )
    products_s = statistics.mean(h["bench/products_s"] for h in history)
    if products_s:
        products_rate = statistics.mean(h["bench/products_gflop"] for h in history) / products_s
        print(
            f"its oneDNN products, timed where they run: {products_s:.3f} s ({products_s / update_s:.0%} of the update) at "
            f"{products_rate:.1f} GFLOP/s, {products_rate / peak_gflops:.0%} of that peak: the update's ceiling if nothing else took "
            f"time; the other {update_s - products_s:.3f} s are element-wise work, attention, layout copies and autograd"
        )
    else:
        print("its products were not timed in place (the Linear layers run on torch's BLAS, not polyrl's oneDNN route)")
    print(
        f"padding: {1 - real / computed:.1%} of the {computed:.0f} token positions computed "
        f"({statistics.mean(h['bench/forwards'] for h in history):.0f} forwards) · optimizer {optimizer / update_s:.1%} of the update · "
        f"{statistics.mean(h['bench/page_faults'] for h in history):.0f} page faults per update"
    )
    return {
        "update_s": update_s,
        "useful_gflops": achieved,
        "peak_share": achieved / peak_gflops,
        "padding_share": 1 - real / computed,
        "products_share_of_update": products_s / update_s,
        "peak_share_per_step": statistics.median(per_step) if per_step else float("nan"),
    }


def bare_generate_ratio(arm, repeats: int) -> None:
    """The rollout engine against bare ``llm.generate`` on the same prompts, seeds and settings."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, collector = arm.collector.engine, arm.collector
    rollout_rates, bare_rates = [], []
    for _ in range(repeats):
        prompts = arm.sampler.next_batch(collector.settings.prompts_per_step)
        settings = collector.sampling_settings(999, 0)
        start = time.perf_counter()
        groups = engine.generate(prompts, settings)
        wrapped = time.perf_counter() - start
        tokens = sum(len(c.completion_ids) for g in groups for c in g)
        requests = engine.build_requests(prompts, settings)
        bare_params = [
            SamplingParams(n=p.n, temperature=p.temperature, top_p=p.top_p, top_k=0, max_tokens=p.max_tokens, seed=p.seed)
            for p in requests[1]
        ]
        start = time.perf_counter()
        outputs = engine.llm.generate(
            [TokensPrompt(prompt_token_ids=list(r["prompt_token_ids"])) for r in requests[0]], bare_params, use_tqdm=False
        )
        bare = time.perf_counter() - start
        rollout_rates.append(tokens / wrapped)
        bare_rates.append(sum(len(o.token_ids) for out in outputs for o in out.outputs) / bare)
    rollout, bare = statistics.median(rollout_rates), statistics.median(bare_rates)
    print(
        f"\nrollout engine {rollout:.0f} tok/s vs bare llm.generate {bare:.0f} tok/s on the same batch: {rollout / bare:.1%} (target ≥ 90%)"
    )


def bench_policy(
    size: str,
    *,
    prompts: int,
    samples: int,
    max_tokens: int,
    micro_batch: int,
    steps: int,
    repeats: int,
    threads: int | None,
    compile: bool = False,
    micro_batch_tokens: int | None = None,
    cpu_matmul: str | None = None,
    dtype: str = "float32",
) -> dict[str, float]:
    from polyrl.policies.text import build_random_text_model_dir

    model_dir = build_random_text_model_dir(Path(tempfile.mkdtemp()) / f"m{size}", size, seed=0)
    train = {"steps": 10_000, "learning_rate": 1e-6, "micro_batch_size": micro_batch}
    if threads:
        train["threads"] = threads
    if compile:
        train["compile"] = True
    if micro_batch_tokens:
        train["micro_batch_tokens"] = micro_batch_tokens
    if cpu_matmul:
        train["cpu_matmul"] = cpu_matmul
    config = resolve_arms(
        {
            "name": f"bench{size}",
            "model": {"path": str(model_dir), "dtype": dtype},
            "objective": {"name": "dr_grpo"},
            "rollout": {
                "engine": "vllm",
                "prompts_per_step": prompts,
                "samples_per_prompt": samples,
                "max_tokens": max_tokens,
                "kv_cache_gb": 1.0,
            },
            "rewards": [{"module": "accuracy", "params": {"extract": "hash"}}],
            "train": train,
            "tracking": {"progress": False},
            "checkpoint": {"dir": tempfile.mkdtemp(), "every": 100_000},
        }
    )["main"]
    arm = build_arm(config, arm="main", arm_dir=Path(tempfile.mkdtemp()) / "main")
    try:
        counter = instrument(arm)
        loop = arm.loop(printer=lambda _line: None)
        parameters = sum(p.numel() for p in arm.learner.policy.parameters())
        rows = micro_batch * 53
        matmul_dtype = compute_dtype(dtype)  # the peak of the dtype the learner computes in
        device = str(next(arm.learner.policy.parameters()).device)  # and of the device it computes on (train.device)
        probe, probe_name, peaks_before = peak_probe(size, rows, torch.get_num_threads(), matmul_dtype, device)
        history = run_steps(loop, counter, steps, warmup=3 if compile else 1, probe=probe)
        peaks_after = measure_peaks(size, tokens=rows, threads=torch.get_num_threads(), dtype=matmul_dtype, device=device)
        peaks = {library: (peaks_before[library] + peaks_after[library]) / 2 for library in peaks_before}
        peak_before, peak_after = max(peaks_before.values()), max(peaks_after.values())
        title = (
            f"{size} policy ({parameters / 1e6:.1f}M params), {prompts} prompts × {samples} samples × ≤{max_tokens} new tokens, "
            f"Dr.GRPO, {dtype}, vLLM{', train.compile' if compile else ''}"
            f"{f', micro_batch_tokens {micro_batch_tokens}' if micro_batch_tokens else ''}"
            f"{f', cpu_matmul {cpu_matmul}' if cpu_matmul else ''}"
        )
        result = phase_table(title, history)
        print(
            f"\n{dtype} matmul peak on {device} (bench_matmul, best library) before/after the steps: {peak_before:.1f} / {peak_after:.1f} GFLOP/s; "
            "per library: "
            + ", ".join(f"{library} {value:.1f}" for library, value in peaks.items())
            + f"; the learner's Linear layers ran on: {arm.config.train.cpu_matmul} -> {linear_library(arm.learner.policy)}; "
            f"probe around each step: {probe_name}"
        )
        result.update(update_report(history, parameters, (peak_before + peak_after) / 2, dtype))
        bare_generate_ratio(arm, repeats)
        return result
    finally:
        arm.close()


def bench_demo(steps: int) -> dict[str, float]:
    config = load_experiment(
        ROOT / "experiments" / "grpo_vs_drgrpo.yaml",
        set_options=[
            "tracking.progress=false",
            f"checkpoint.dir={tempfile.mkdtemp()}",
            "checkpoint.every=100000",
            "eval.every=0",
        ],
    )["grpo"]
    arm = build_arm(config, arm="grpo", arm_dir=Path(tempfile.mkdtemp()) / "grpo")
    try:
        counter = instrument(arm)
        r = config.rollout
        title = (
            f"Demo config (grpo arm, {config.model.builtin.size} warm policy, "
            f"{r.prompts_per_step} prompts × {r.samples_per_prompt} samples, max {r.max_tokens} tokens)"
        )
        return phase_table(title, run_steps(arm.loop(printer=lambda _line: None), counter, steps))
    finally:
        arm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="30m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="train.threads (default: the learner's own choice)")
    parser.add_argument(
        "--compile", action="store_true", help="train.compile: torch.compile the policy's decoder (3 warm-up steps)"
    )
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=None, help="train.micro_batch_tokens (rows stay ≤ --micro-batch)"
    )
    parser.add_argument(
        "--cpu-matmul",
        choices=["auto", "onednn", "torch"],
        default=None,
        help="train.cpu_matmul (default: the config default, auto)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="model.dtype; the update is then put against the matmul peak of that dtype",
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--demo", action="store_true", help="Also time the demo config (builds its warm policy once).")
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps
    print(f"# RL step benchmark ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")
    if args.demo:
        bench_demo(steps)
    bench_policy(
        args.size,
        prompts=args.prompts,
        samples=args.samples,
        max_tokens=args.max_tokens,
        micro_batch=args.micro_batch,
        steps=steps,
        repeats=1 if args.quick else args.repeats,
        threads=args.threads,
        compile=args.compile,
        micro_batch_tokens=args.micro_batch_tokens,
        cpu_matmul=args.cpu_matmul,
        dtype=args.dtype,
    )


if __name__ == "__main__":
    main()
