"""Peak memory and time per step of whole RL steps, per policy size, full fine-tuning and LoRA.

Run: ``python bench/bench_memory.py`` (``--policies 3m 30m smollm2-135m-instruct``, ``--modes full lora``,
``--steps``). Each (policy, mode) runs in its own fresh process: the arm is built as ``polyrl run``
builds it (vLLM engine in-process, fp32 learner, AdamW), one warm-up step, then ``--steps`` timed
steps of ``--prompts`` × ``--samples`` samples, Dr.GRPO, micro-batches of 16, one update per step.
The random 3m/30m policies get the arithmetic prompts (nearly every sample runs to ``--max-tokens``);
SmolLM2-135M-Instruct gets the ``arithmetic_chat`` prompts through its chat template (short answers).
LoRA: r 16, alpha 32, all-linear, merged-weights sync (``lora``) or the adapter through vLLM's LoRA
support (``lora-adapter``, ``model.lora.sync: adapter``).

Reported per run: parameters, seconds per step and per phase (generate, advantage, update, sync),
mean completion length, and the process's peak RSS (``ru_maxrss``: learner weights, gradients and
AdamW state, vLLM's own copy of the weights and its KV cache ``--kv-cache-gb``, and activations). Then
a straight line through the full fine-tuning points, peak RSS = fixed + bytes/parameter × parameters,
extrapolated to the largest policy whose peak fits ``--budget-gib`` (an extrapolation: say so when quoting it).
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULT_MARK = "BENCH_MEMORY_RESULT "
PRETRAINED = ("smollm2-135m-instruct",)
LORA = {"r": 16, "alpha": 32.0, "target_modules": "all-linear"}
PHASES = ("generate", "advantage", "update", "sync")


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(policy: str, mode: str, steps: int, prompts: int, samples: int, max_tokens: int, kv_cache_gb: float) -> dict:
    from polyrl.config.schema import resolve_arms
    from polyrl.trainer.build_arm import build_arm

    pretrained = policy in PRETRAINED
    model = {"builtin": {"name": policy}} if pretrained else {"builtin": {"size": policy, "warmup_steps": 0}}
    if mode != "full":
        model["lora"] = {**LORA, "sync": "adapter" if mode == "lora-adapter" else "merged"}
    config = resolve_arms(
        {
            "name": "bench_memory",
            "model": model,
            "data": {"source": "arithmetic_chat", "chat_template": True} if pretrained else {"source": "arithmetic"},
            "objective": {"name": "dr_grpo"},
            "rollout": {
                "engine": "vllm",
                "prompts_per_step": prompts,
                "samples_per_prompt": samples,
                "max_tokens": max_tokens,
                "kv_cache_gb": kv_cache_gb,
            },
            "rewards": [{"module": "accuracy", "params": {"extract": "auto"}}],
            "train": {"steps": 10_000, "learning_rate": 1e-6, "micro_batch_size": 16, "max_grad_norm": 1.0},
            "tracking": {"progress": False},
            "checkpoint": {"dir": tempfile.mkdtemp(), "every": 100_000},
        }
    )["main"]
    arm = build_arm(config, arm="main", arm_dir=Path(tempfile.mkdtemp()) / "main")
    startup_s, startup_rss = time.perf_counter() - PROCESS_START, peak_rss_mib()
    parameters = sum(p.numel() for p in arm.learner.policy.parameters())
    trainable = sum(p.numel() for p in arm.learner.policy.parameters() if p.requires_grad)
    loop = arm.loop(printer=lambda _line: None)
    try:
        loop.step()  # warm-up
        seconds, lengths, phases = [], [], []
        for _ in range(steps):
            start = time.perf_counter()
            metrics = loop.step()
            seconds.append(time.perf_counter() - start)
            lengths.append(metrics["rollout/response_length/mean"])
            phases.append({phase: metrics.get(f"perf/{phase}_s", 0.0) for phase in PHASES})
    finally:
        arm.close()
    return {
        "parameters": parameters,
        "trainable": trainable,
        "step_s": seconds,
        "mean_length": statistics.mean(lengths),
        "phases": {p: statistics.median(x[p] for x in phases) for p in PHASES},
        "startup_s": startup_s,
        "startup_rss_mib": startup_rss,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_worker(policy: str, mode: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        policy,
        mode,
        "--steps",
        str(args.steps),
        "--prompts",
        str(args.prompts),
        "--samples",
        str(args.samples),
        "--max-tokens",
        str(args.max_tokens),
        "--kv-cache-gb",
        str(args.kv_cache_gb),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=tempfile.mkdtemp())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    return {"error": f"exit {done.returncode}: " + " | ".join(done.stderr.splitlines()[-5:])[-1000:]}


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` through ``points`` (at least two distinct x)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["3m", "30m", *PRETRAINED], choices=["3m", "30m", *PRETRAINED])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["full", "lora"],
        choices=["full", "lora", "lora-adapter"],
        help="lora: merged-weights sync (the default model.lora.sync); lora-adapter: model.lora.sync adapter",
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--budget-gib", type=float, default=24.0, help="The memory the extrapolation fits the peak into.")
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--json", default=None, help="Also write the results here (and read earlier ones from it to fit).")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(*args.worker, args.steps, args.prompts, args.samples, args.max_tokens, args.kv_cache_gb)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return

    saved = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    print(
        f"# bench_memory: {os.cpu_count()} cores, {args.prompts}×{args.samples} samples/step, max {args.max_tokens} new tokens, "
        f"KV cache {args.kv_cache_gb} GiB, fp32, {args.steps} timed steps after 1 warm-up"
    )
    for policy in args.policies:
        for mode in args.modes:
            saved[f"{policy}/{mode}"] = run_worker(policy, mode, args)
            if args.json:
                Path(args.json).write_text(json.dumps(saved, indent=1))
    print(
        "\n| policy | mode | parameters (trainable) | step s | generate s | advantage s | update s | sync s | mean length | "
        "peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for key, r in saved.items():
        policy, mode = key.split("/")
        if "error" in r:
            print(f"| {policy} | {mode} | {r['error'][:200]} | | | | | | | |")
            continue
        ph = r["phases"]
        print(
            f"| {policy} | {mode} | {r['parameters'] / 1e6:.1f}M ({r['trainable'] / 1e6:.2f}M) | {statistics.median(r['step_s']):.2f} | "
            f"{ph['generate']:.2f} | {ph['advantage']:.2f} | {ph['update']:.2f} | {ph['sync']:.2f} | {r['mean_length']:.1f} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    full = [(r["parameters"], r["peak_rss_mib"]) for k, r in saved.items() if k.endswith("/full") and "error" not in r]
    if len({x for x, _ in full}) >= 2:
        fixed, per_param = fit_line(full)
        largest = (args.budget_gib * 1024 - fixed) / per_param
        print(
            f"\nFull fine-tuning, fitted: peak RSS ≈ {fixed:.0f} MiB + {per_param * 2**20:.1f} B/parameter; the largest policy "
            f"whose peak fits {args.budget_gib:.0f} GiB (extrapolated, same batch and KV cache): ≈ {largest / 1e6:.0f}M parameters"
        )


if __name__ == "__main__":
    main()
