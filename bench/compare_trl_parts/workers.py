"""compare_trl.py's workers, each run in its own process: polyrl's arm and TRL's ``GRPOTrainer`` on
the same work (see compare_trl.py's docstring), and the inputs both share (the arithmetic rows,
the accuracy reward, the long-writer policy). With ``trace`` (an :class:`RssTrace`,
``--trace-rss``) each side labels its phases so that the resident memory of each is reported:
polyrl's collect (generate + score), update (its micro-batches' forwards, optimizer step) and
sync; TRL's generate, micro-batches (forward + backward) and optimizer step.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from compare_trl_parts.rss_trace import peak_rss_mib

PROMPTS, SAMPLES, MICRO_BATCH, LEARNING_RATE = 8, 8, 16, 1e-6
LORA = {"r": 16, "alpha": 32.0, "target_modules": "all-linear"}  # --lora, the same on both sides
# polyrl's model.dtype per --precision: bf16 is mixed precision on both sides (fp32 weights and
# AdamW state, bf16 autocast compute; TRL's ``bf16=True``), and polyrl's vLLM samples in bf16.
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}


def arithmetic_rows(chat: bool = False) -> list[dict]:
    """The arithmetic task's train rows; ``chat``: in the ``arithmetic_chat`` form (one user message)."""
    from polyrl.tasks.arithmetic import __file__ as task_file
    from polyrl.tasks.arithmetic import chat_row

    path = Path(task_file).parent / "data" / "arithmetic" / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**row, **chat_row(row)} for row in rows] if chat else rows


def accuracy_scores(prompts: list[str], completions: list[str], answers: list[str], extract: str = "hash") -> list[float]:
    from polyrl.rewards import load_reward_class
    from polyrl.rewards.base import RewardBatch

    reward = load_reward_class("accuracy")(extract=extract)
    scores = reward.score(RewardBatch(prompts=prompts, completions=completions, references=[[a] for a in answers]))
    return [0.0 if s is None else float(s) for s in scores]


def long_writer_policy(source: Path, target: Path, push: float = 1e3) -> Path:
    """A copy of ``source`` that never ends its answers (same weights elsewhere).

    The residual stream gets one constant dimension: embeddings set it to a constant, every
    attention/MLP output projection writes 0 into it, so after the final RMSNorm it is positive
    for every token; the end-of-sequence row of the output head reads only that dimension, with
    weight ``-push``. Its logit is then far below every other token's.
    """
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    shutil.copytree(source, target)
    weights_path = target / "model.safetensors"
    weights = load_file(str(weights_path))
    eos = AutoTokenizer.from_pretrained(str(source)).eos_token_id
    embed = weights["model.embed_tokens.weight"]
    embed[:, 0] = 4.0 * embed[:, 1:].abs().mean() * embed.shape[1] ** 0.5
    for name, tensor in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            tensor[0, :] = 0.0
    head = weights.get("lm_head.weight", embed)
    if head is embed:
        raise ValueError("long_writer_policy needs an untied output head")
    head[eos] = 0.0
    head[eos, 0] = -push
    save_file({k: v.contiguous() for k, v in weights.items()}, str(weights_path), metadata={"format": "pt"})
    return target


def skip_host_trims() -> None:
    """The bench's A/B of polyrl's heap trims: the loop's (before the update and before the
    sync) become no-ops, in this worker process only."""
    import polyrl.trainer.loop as loop

    def skipped() -> bool:
        return False

    loop.release_freed_host_memory = skipped


def default_host_allocator() -> None:
    """The bench's A/B of polyrl's raised glibc thresholds (runtime/host_memory.py): glibc's
    defaults kept, in this worker process only."""
    import polyrl.trainer.build_models as setup

    setup.keep_freed_host_memory = lambda: "unchanged: compare_trl's default-malloc arm"


def polyrl_settings(
    policy: str,
    regime: dict,
    *,
    compile: bool = False,
    micro_batch_tokens: int | None = None,
    micro_batch: int | None = None,
    cpu_matmul: str = "auto",
    share_prompts: bool = False,
    precision: str = "fp32",
    rollout_dtype: str | None = None,
    rollout_compile: bool = False,
    chat: bool = False,
    lora: bool = False,
    lora_sync: str = "merged",
    kv_cache_gb: float | str = "auto",
    gradient_checkpointing: bool = False,
) -> dict:
    """polyrl's experiment settings for the compared work (one arm, ``main``)."""
    return {
        "name": "compare_trl",
        "model": {"path": policy, "dtype": PRECISIONS[precision], **({"lora": {**LORA, "sync": lora_sync}} if lora else {})},
        "data": {"source": "arithmetic_chat", "chat_template": True} if chat else {"source": "arithmetic"},
        "objective": {"name": "dr_grpo"},
        "rollout": {
            "engine": "vllm",
            "prompts_per_step": PROMPTS,
            "samples_per_prompt": SAMPLES,
            "max_tokens": regime["max_tokens"],
            "temperature": 1.0,
            "kv_cache_gb": kv_cache_gb,
            "dtype": rollout_dtype,
            "compile": rollout_compile,
        },
        "rewards": [{"module": "accuracy", "params": {"extract": "auto" if chat else "hash"}}],
        "train": {
            "steps": 10_000,
            "learning_rate": LEARNING_RATE,
            "micro_batch_size": micro_batch or MICRO_BATCH,
            "max_grad_norm": 1.0,
            "compile": compile,
            "micro_batch_tokens": micro_batch_tokens,
            "cpu_matmul": cpu_matmul,
            "gradient_checkpointing": gradient_checkpointing,
            "share_prompts": share_prompts,
        },
        "tracking": {"progress": False},
        "checkpoint": {"dir": tempfile.mkdtemp(), "every": 100_000},
    }


def polyrl_worker(
    policy: str, regime: dict, steps: int, *, process_start: float = 0.0, trace: Any = None, **settings: Any
) -> dict:
    """One polyrl arm built from :func:`polyrl_settings` (``settings`` are its keyword arguments), timed."""
    from polyrl.config.schema import resolve_arms
    from polyrl.runtime.cpu_matmul import linear_library
    from polyrl.trainer.build_arm import build_arm

    compile = settings.get("compile", False)
    config = resolve_arms(polyrl_settings(policy, regime, **settings))["main"]
    with trace.phase("build the arm") if trace else contextlib.nullcontext():
        arm = build_arm(config, arm="main", arm_dir=Path(tempfile.mkdtemp()) / "main")
    startup = time.perf_counter() - process_start
    loop = arm.loop(printer=lambda _line: None)
    if trace:
        trace_polyrl(trace, loop)
    try:
        warmup_started = time.perf_counter()
        for _ in range(3 if compile else 1):  # warm-up (with train.compile: the one-off compilations too)
            with trace.phase("warm-up step") if trace else contextlib.nullcontext():
                loop.step()
        warmup_s = time.perf_counter() - warmup_started
        seconds, lengths, generate, gaps, phases = [], [], [], [], []
        for _ in range(steps):
            start = time.perf_counter()
            with trace.phase("timed step") if trace else contextlib.nullcontext():
                metrics = loop.step()
            seconds.append(time.perf_counter() - start)
            lengths.append(metrics["rollout/response_length/mean"])
            generate.append(metrics["perf/generate_s"])
            gaps.append(metrics["rollout/logprob_gap"])
            phases.append({k[5:-2]: v for k, v in metrics.items() if k.startswith("perf/") and k.endswith("_s")})
    finally:
        arm.close()
    return {
        "startup_s": startup,
        "step_s": seconds,
        "mean_length": lengths,
        "samples": PROMPTS * SAMPLES,
        "generate_s": generate,
        "phases": phases,
        "peak_rss_mib": peak_rss_mib(),
        "warmup_s": warmup_s,
        "cpu_matmul": linear_library(arm.learner.policy),
        "logprob_gap": max(gaps),
        **({"rss_trace": trace.close()} if trace else {}),
    }


def trace_polyrl(trace: Any, loop: Any) -> None:
    """polyrl's phases in ``trace``: collect, update (with each micro-batch's forward and the
    optimizer step inside it; a backward runs between two forwards) and sync."""
    trace.wrap(loop.collector, "collect", "collect (generate + score)")
    trace.wrap(loop.learner, "update", "update")
    trace.wrap(loop.learner, "policy_loss", "  micro-batch forward")
    trace.wrap(loop.learner.optimizer, "step", "  optimizer step")
    trace.wrap(loop, "sync", "sync")


def trl_settings(
    regime: dict,
    total_steps: int,
    *,
    use_vllm: bool = False,
    precision: str = "fp32",
    compile: bool = False,
    gradient_checkpointing: bool = False,
) -> dict:
    """TRL ``GRPOConfig`` keyword arguments for the compared work (the same as :func:`polyrl_settings`)."""
    import torch

    return dict(
        output_dir=tempfile.mkdtemp(),
        max_steps=total_steps,
        torch_compile=compile,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=PROMPTS * SAMPLES // MICRO_BATCH,
        num_generations=SAMPLES,
        max_completion_length=regime["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        learning_rate=LEARNING_RATE,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dr_grpo",
        scale_rewards="none",
        num_iterations=1,
        use_cpu=not torch.cuda.is_available(),
        bf16=precision == "bf16",
        fp16=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_dropout=True,
        lr_scheduler_type="constant",
        warmup_steps=0,
        use_vllm=use_vllm,
        # Pinned: TRL's GRPOConfig turns gradient checkpointing on by default (TrainingArguments: off), and
        # polyrl's default is off. Left at TRL's default, TRL recomputed every layer's activations in the
        # backward, polyrl did not: not the same work (TRL slower, with less memory).
        gradient_checkpointing=gradient_checkpointing,
        **({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": 512} if use_vllm else {}),
    )


def trl_worker(
    policy: str,
    regime: dict,
    steps: int,
    use_vllm: bool,
    precision: str = "fp32",
    compile: bool = False,
    chat: bool = False,
    lora: bool = False,
    gradient_checkpointing: bool = False,
    process_start: float = 0.0,
    trace: Any = None,
) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = arithmetic_rows(chat)
    # Chat: TRL's conversational prompts (it applies the tokenizer's chat template, as polyrl's data.chat_template).
    dataset = Dataset.from_list([{"prompt": r["messages"] if chat else r["prompt"], "answer": r["answer"]} for r in rows])

    def accuracy(prompts, completions, answer, **_):
        if chat:  # conversational: lists of messages
            prompts, completions = [p[-1]["content"] for p in prompts], [c[-1]["content"] for c in completions]
        return accuracy_scores(prompts, completions, answer, extract="auto" if chat else "hash")

    class StepClock(TrainerCallback):
        def __init__(self):
            self.seconds, self.lengths, self.start = [], [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    warmup_steps = 3 if compile else 1  # compiled: the one-off compilations (several, as shapes change) stay out of the rates
    args = GRPOConfig(
        **trl_settings(
            regime,
            steps + warmup_steps,
            use_vllm=use_vllm,
            precision=precision,
            compile=compile,
            gradient_checkpointing=gradient_checkpointing,
        )
    )
    clock = StepClock()
    callbacks = [clock, trl_trace_callback(trace)] if trace else [clock]
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"], lora_dropout=0.0, bias="none"
        )
    with trace.phase("build the trainer") if trace else contextlib.nullcontext():
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=[accuracy],
            args=args,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(policy),
            callbacks=callbacks,
            peft_config=peft_config,
        )
    # Log-probs outside the update's own forward (old/reference log-probs; none with one update per
    # step and beta 0, as here) are timed apart from the update.
    logprob_seconds: list[float] = []
    score = trainer._get_per_token_logps_and_entropies

    def timed_logprobs(*args, **kwargs):
        if torch.is_grad_enabled():
            return score(*args, **kwargs)
        start = time.perf_counter()
        try:
            return score(*args, **kwargs)
        finally:
            logprob_seconds.append(time.perf_counter() - start)

    trainer._get_per_token_logps_and_entropies = timed_logprobs
    # Generation's share of TRL's step: its HF path calls the (unwrapped, on CPU the same) model's generate.
    generate_seconds: list[float] = []
    model_generate = trainer.model.generate

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return model_generate(*args, **kwargs)
        finally:
            generate_seconds.append(time.perf_counter() - start)

    if not use_vllm:
        trainer.model.generate = timed_generate
    if trace:
        trace.wrap(trainer.model, "generate", "  generate")
        trace.wrap(trainer, "training_step", "  micro-batch (forward + backward)")
    startup = time.perf_counter() - process_start
    trainer.train()
    if compile:  # that the Trainer really ran a compiled forward, not silently eager
        from torch._dynamo.utils import counters

        if not counters["stats"]["unique_graphs"]:
            raise RuntimeError("TRL torch_compile=True compiled no graph")
    timed = clock.seconds[warmup_steps:]
    per_step_generate = (
        generate_seconds[-len(timed) :] if generate_seconds and len(generate_seconds) == len(clock.seconds) else []
    )
    return {
        "startup_s": startup,
        "step_s": timed,
        "mean_length": clock.lengths[warmup_steps:],
        "samples": PROMPTS * SAMPLES,
        "generate_s": per_step_generate,
        "warmup_s": sum(clock.seconds[:warmup_steps]),
        "peak_rss_mib": peak_rss_mib(),
        **({"rss_trace": trace.close()} if trace else {}),
        "phases": [
            {"generate": g, "no-grad log-probs": sum(logprob_seconds) / max(len(clock.seconds), 1)} for g in per_step_generate
        ],
        "optimizer": type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer).__name__,
    }


def trl_trace_callback(trace: Any) -> Any:
    """A Trainer callback that labels TRL's steps and optimizer steps in ``trace``."""
    from transformers import TrainerCallback

    class TracePhases(TrainerCallback):
        def __init__(self):
            self.open: dict[str, Any] = {}

        def enter(self, name: str) -> None:
            self.open[name] = trace.phase(name)
            self.open[name].__enter__()

        def leave(self, name: str) -> None:
            self.open.pop(name).__exit__(None, None, None)

        def on_step_begin(self, args, state, control, **kwargs):
            self.enter("step")

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.enter("  optimizer step")

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.leave("  optimizer step")

        def on_step_end(self, args, state, control, **kwargs):
            self.leave("step")

    return TracePhases()
