"""Time per phase of a whole RL step, samples/s, orchestration overhead, and the rollout phase
against bare vLLM generation of the same batch — measured side by side in one run.

Run: ``python bench/bench_step.py`` (``--quick`` for fewer steps).

Part 1, the demo config (``experiments/grpo_vs_drgrpo.yaml``, grpo arm, its warm policy):
mean seconds per phase (generate, score, advantage, update, sync, log) over ``--steps`` steps
after one warm-up step, samples/s of the whole step, and the share of step time spent outside
generate/score/update (orchestration overhead: advantage, sync, log; goal < 5 %).

Part 2, the throughput target: a ~30M-parameter policy (random weights, so nearly every sample
runs to the token limit), 8 prompts × 8 samples × 64 new tokens per step, GRPO, vLLM engine.
Same per-phase table, then, in the same process and on the same engine, bare ``llm.generate``
of the same prompts with the same seeds and sampling settings (no log-probs, no post-processing)
so "rollout phase / bare vLLM" compares equal work.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyrl.config.schema import load_experiment, resolve_arms  # noqa: E402
from polyrl.roles.trainer import PHASES, ArmTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_steps(trainer: ArmTrainer, steps: int) -> list[dict[str, float]]:
    trainer.step()  # warm-up: first-call costs (allocator, kernels) are not steady state
    return [trainer.step() for _ in range(steps)]


def phase_table(title: str, history: list[dict[str, float]]) -> dict[str, float]:
    means = {phase: statistics.mean(h[f"perf/{phase}_s"] for h in history) for phase in PHASES}
    step = statistics.mean(h["perf/step_s"] for h in history)
    samples = statistics.mean(h["rollout/samples"] for h in history)
    overhead = step - means["generate"] - means["score"] - means["update"]
    print(f"\n## {title}\n")
    print("| phase | s/step | share |\n|---|---|---|")
    for phase in PHASES:
        print(f"| {phase} | {means[phase]:.3f} | {means[phase] / step:.1%} |")
    print(f"| **step** | **{step:.3f}** | 100% |")
    print(f"\nsamples/step {samples:.0f} · samples/s {samples / step:.2f} · "
          f"orchestration overhead (outside generate/score/update) {overhead / step:.1%} · "
          f"mean response length {statistics.mean(h['rollout/response_length/mean'] for h in history):.1f} tokens")
    return {"step_s": step, "samples_per_s": samples / step, "overhead_share": overhead / step, **means}


def bench_demo(steps: int) -> dict[str, float]:
    config = load_experiment(ROOT / "experiments" / "grpo_vs_drgrpo.yaml",
                             set_options=["tracking.progress=false", f"checkpoint.dir={tempfile.mkdtemp()}",
                                          "checkpoint.every=100000"])["grpo"]
    trainer = ArmTrainer(config, arm="grpo", arm_dir=Path(tempfile.mkdtemp()) / "grpo")
    trainer.setup()
    try:
        r = config.rollout
        title = (f"Demo config (grpo arm, {config.model.builtin.size} warm policy, "
                 f"{r.prompts_per_step} prompts × {r.samples_per_prompt} samples, max {r.max_tokens} tokens)")
        return phase_table(title, run_steps(trainer, steps))
    finally:
        trainer.close()


def bench_30m(steps: int, repeats: int) -> None:
    from polyrl.models.text import build_random_text_model_dir

    model_dir = build_random_text_model_dir(Path(tempfile.mkdtemp()) / "m30", "30m", seed=0)
    config = resolve_arms({
        "name": "bench30m",
        "model": {"path": str(model_dir)},
        "rollout": {"engine": "vllm", "prompts_per_step": 8, "samples_per_prompt": 8, "max_tokens": 64, "kv_cache_gb": 1.0},
        "rewards": [{"module": "accuracy"}],
        "train": {"steps": 10_000, "learning_rate": 1e-6, "micro_batch_size": 16},
        "tracking": {"progress": False},
        "checkpoint": {"dir": tempfile.mkdtemp(), "every": 100_000},
    })["main"]
    trainer = ArmTrainer(config, arm="main", arm_dir=Path(tempfile.mkdtemp()) / "main")
    trainer.setup()
    try:
        history = run_steps(trainer, steps)
        result = phase_table("~30M policy, 8 prompts × 8 samples × 64 new tokens, GRPO, vLLM", history)
        # Same work through bare vLLM: same prompts and seeds → the same tokens are sampled.
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rollout_rates, bare_rates = [], []
        for _ in range(repeats):
            prompts = trainer.sampler.next_batch(8)
            settings = trainer.sampling_settings(step=999)
            start = time.perf_counter()
            groups = trainer.engine.generate(prompts, settings)
            wrapped = time.perf_counter() - start
            tokens = sum(len(c.completion_ids) for g in groups for c in g)
            requests = trainer.engine.build_requests(prompts, settings)
            bare_params = [SamplingParams(n=p.n, temperature=p.temperature, top_p=p.top_p, top_k=0, max_tokens=p.max_tokens, seed=p.seed)
                           for p in requests[1]]
            start = time.perf_counter()
            outputs = trainer.engine.llm.generate([TokensPrompt(prompt_token_ids=list(r["prompt_token_ids"])) for r in requests[0]],
                                                  bare_params, use_tqdm=False)
            bare = time.perf_counter() - start
            bare_tokens = sum(len(o.token_ids) for out in outputs for o in out.outputs)
            rollout_rates.append(tokens / wrapped)
            bare_rates.append(bare_tokens / bare)
        rollout, bare = statistics.median(rollout_rates), statistics.median(bare_rates)
        print(f"\nrollout engine {rollout:.0f} tok/s vs bare llm.generate {bare:.0f} tok/s on the same batch: "
              f"{rollout / bare:.1%} (target ≥ 90%)")
        print(f"whole RL step: {result['samples_per_s']:.2f} samples/s (target ≥ 10)")
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps
    print(f"# RL step benchmark ({os.cpu_count()} cores)")
    if not args.skip_demo:
        bench_demo(steps)
    bench_30m(steps, 1 if args.quick else args.repeats)


if __name__ == "__main__":
    main()
