"""What the non-finite snapshot cost the update: peak RSS and seconds per update, with and without it.

Run: ``python bench/bench_snapshot.py`` (``--policy 30m`` or ``smollm2-135m-instruct``, ``--updates``,
``--mini-batches``, ``--rows``, ``--completion-tokens``). Until 2026-12-06 the learner copied every
weight and the whole AdamW state before each update whose optimizer steps outnumber
``train.max_consecutive_nonfinite`` (every PPO run and both shipped clip experiments, with
``mini_batches: 4``), to put them back if the non-finite guard ran out part-way. The learner no
longer does (a stop ends the update there and the loop saves a whole step); the ``copy`` arm makes
that same copy (``state_dict`` clones of the policy, a deep copy of the AdamW state, held through
the update, as the old ``PolicyLearner._snapshot`` did) before each update of today's learner, and
the ``none`` arm does not.

Each arm runs in its own fresh process: the policy in fp32, GRPO, AdamW, one warm-up update (AdamW's
state exists from then on, as in every update after a run's first), then ``--updates`` timed
updates of one synthetic batch (``--rows`` rows of a 16-token prompt and ``--completion-tokens``
completion tokens, random ids, random advantages). Reported: the process's peak RSS (``ru_maxrss``),
the median wall and CPU seconds per update (the copy included) and the median seconds of the copy
alone, each arm's and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULT_MARK = "BENCH_SNAPSHOT_RESULT "
ARMS = ("copy", "none")
PRETRAINED = ("smollm2-135m-instruct",)


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def old_snapshot(learner) -> dict:
    """The copy the learner used to make before such an update (weights and AdamW state)."""
    return {
        "policy": {name: tensor.detach().clone() for name, tensor in learner.policy.state_dict().items()},
        "optimizer": copy.deepcopy(learner.optimizer.state_dict()),
        "optimizer_step": learner.optimizer_step,
    }


def policy_dir(policy: str, root: Path) -> Path:
    if policy in PRETRAINED:
        from polyrl.policies.pretrained import pretrained_dir

        return Path(pretrained_dir(policy))
    from polyrl.policies.text import build_random_text_model_dir

    return build_random_text_model_dir(root / f"policy_{policy}", policy, seed=0)


def worker(arm: str, directory: str, updates: int, mini_batches: int, rows: int, completion_tokens: int) -> dict:
    import torch

    from polyrl.algos.objectives import get_objective
    from polyrl.core.types import Completion
    from polyrl.engines.image_prompts import auto_model_class
    from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
    from polyrl.modeling.logprobs import pack_completions
    from polyrl.rollout.batches import LearnerBatch
    from polyrl.runtime.threads import set_torch_threads

    set_torch_threads(os.cpu_count() or 1)
    policy = auto_model_class(directory).from_pretrained(directory, dtype=torch.float32)
    vocab = int(policy.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    completions = [
        Completion(
            prompt_ids=torch.randint(3, vocab, (16,), generator=generator).tolist(),
            completion_ids=torch.randint(3, vocab, (completion_tokens,), generator=generator).tolist(),
            text="",
            sampling_logprobs=[-3.0] * completion_tokens,
            finish_reason="length",
        )
        for _ in range(rows)
    ]
    packed = pack_completions(completions, pad_token_id=0)
    advantages = torch.randn(packed.response_mask.shape, generator=generator) * packed.response_mask
    batch = LearnerBatch(packed=packed, old_logprobs=None, advantages=advantages)
    spec = get_objective("grpo")
    settings = LearnerSettings(
        aggregation=spec.default_aggregation,
        objective_params=dict(spec.default_params),
        learning_rate=1e-6,
        mini_batches=mini_batches,
        micro_batch_size=8,
        max_tokens=completion_tokens,
        total_steps=updates + 1,
    )
    learner = PolicyLearner(policy, spec, settings)
    assert learner.optimizer_steps_per_step() > settings.max_consecutive_nonfinite  # where the old learner copied
    seconds, cpu_seconds, copy_seconds = [], [], []
    for index in range(updates + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        snapshot = old_snapshot(learner) if arm == "copy" else None
        copied = time.perf_counter()
        learner.update(batch, index)
        del snapshot
        if index:  # the first update creates AdamW's state: a warm-up
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
            copy_seconds.append(copied - start)
    return {
        "arm": arm,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "update_s": statistics.median(seconds),
        "update_cpu_s": statistics.median(cpu_seconds),
        "copy_s": statistics.median(copy_seconds),
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="30m", help="3m, 30m (random built-in) or smollm2-135m-instruct")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--mini-batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--completion-tokens", type=int, default=48)
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--policy-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.policy_dir, args.updates, args.mini_batches, args.rows, args.completion_tokens)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = policy_dir(args.policy, Path(tmp))
        results = {}
        for arm in ARMS:
            command = [sys.executable, __file__, "--worker", arm, "--policy-dir", str(directory), "--updates", str(args.updates)]
            command += ["--mini-batches", str(args.mini_batches), "--rows", str(args.rows)]
            command += ["--completion-tokens", str(args.completion_tokens)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
            if done.returncode != 0 or not lines:
                sys.exit(f"arm {arm} failed:\n{done.stderr[-3000:]}")
            results[arm] = json.loads(lines[-1][len(RESULT_MARK) :])
    copy_arm, none_arm = results["copy"], results["none"]
    print(
        f"policy {args.policy} ({copy_arm['parameters'] / 1e6:.1f}M parameters, fp32), mini_batches {args.mini_batches}, "
        f"{args.rows} rows x (16 + {args.completion_tokens}) tokens, median of {args.updates} updates"
    )
    print(f"{'':24}{'with the copy':>16}{'without':>12}{'ratio':>10}")
    rows = (
        ("peak_rss_mib", "peak RSS (MiB)"),
        ("update_s", "seconds per update"),
        ("update_cpu_s", "CPU seconds per update"),
        ("copy_s", "seconds in the copy"),
    )
    for key, label in rows:
        a, b = copy_arm[key], none_arm[key]
        ratio = f"{b / a:10.3f}" if a else f"{'':>10}"
        print(f"{label:24}{a:16.2f}{b:12.2f}{ratio}")
    print("(CPU seconds: the process's, all threads; wall seconds move with whatever else shares the host.)")


if __name__ == "__main__":
    main()
