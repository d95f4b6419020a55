"""On-policy distillation trained on tiny models: pure distillation lowers the student's reverse KL
to a fixed teacher; a teacher equal to the student scores exactly the sampler's log-probs; the
teacher term on top of a task reward with a LoRA student in an asynchronous run; an episode's
observation tokens get no teacher score and no teacher term."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.config.schema import resolve_arms


@pytest.fixture(scope="module")
def sharp_teacher_dir(tmp_path_factory):
    """A random tiny model with the student's character tokenizer (another seed) and its output head
    scaled by 8: a peaked distribution the random student is far from (reverse KL ~1.8 nats/token)."""
    from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm, save_model_dir

    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=1)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return save_model_dir(model, tokenizer, tmp_path_factory.mktemp("sharp_teacher") / "model")


def _train(raw, tmp_path):
    from polyrl.trainer.build_arm import build_arm

    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        before = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters() if p.requires_grad}
        history = arm.loop().run()
        changed = any(not torch.equal(before[n], p) for n, p in arm.learner.policy.named_parameters() if n in before)
    finally:
        arm.close()
    return arm, history, changed


def test_pure_distillation_lowers_the_students_reverse_kl(tmp_path, tiny_experiment, sharp_teacher_dir):
    raw = tiny_experiment(
        rollout={"prompts_per_step": 8, "samples_per_prompt": 4, "max_tokens": 16},
        train={"steps": 12, "learning_rate": 3e-3, "micro_batch_size": 32},
        distill={"teacher": {"path": str(sharp_teacher_dir)}, "task_reward": False},
    )
    _, history, changed = _train(raw, tmp_path)
    kl = [m["distill/reverse_kl"] for m in history]
    # Measured here: 1.76 at step 1, about 1.2 over the last steps (lr 3e-3, 32 samples of 16 tokens a step).
    first, last = sum(kl[:3]) / 3, sum(kl[-4:]) / 4
    assert kl[0] > 1.0 and last < 0.9 * first, kl
    assert changed and all(math.isfinite(m["actor/loss"]) for m in history)
    for m in history:
        assert m["distill/reverse_kl_p10"] <= m["distill/reverse_kl_p50"] <= m["distill/reverse_kl_p90"]
        assert m["perf/teacher_s"] > 0 and m["distill/teacher_logprob"] < 0


def test_a_teacher_equal_to_the_student_scores_the_samplers_own_logprobs(tmp_path, tiny_experiment, random_policy_dir):
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(train={"steps": 1, "learning_rate": 1e-3, "micro_batch_size": 8},
                          distill={"teacher": {"path": str(random_policy_dir)}})  # fmt: skip
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        assert any("self-distillation" in note for note in arm.data_warnings)
        history = arm.loop().run()
    finally:
        arm.close()
    # The HF engine samples in fp32 with the same weights at the same temperature: each token's reverse
    # KL is rounding, so the teacher scored the very ids the sampler drew, at the right positions.
    metrics = history[0]
    assert abs(metrics["distill/reverse_kl_p10"]) < 1e-5 and abs(metrics["distill/reverse_kl_p90"]) < 1e-5


def test_the_teacher_term_joins_a_task_reward_for_a_lora_student_in_an_asynchronous_run(
    tmp_path, tiny_experiment, sharp_teacher_dir
):
    raw = tiny_experiment(
        model={"lora": {"r": 4, "alpha": 8}},
        rollout={"max_staleness": 1},
        train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8},
        distill={"teacher": {"path": str(sharp_teacher_dir)}, "coef": 0.5},
    )
    arm, history, changed = _train(raw, tmp_path)
    assert changed and arm.collector.teacher is not None
    assert len(history) == 3 and all(math.isfinite(m["actor/loss"]) for m in history)
    for m in history:
        # Scored in the producer thread with its rows; the task reward is there too.
        assert m["distill/reverse_kl"] > 0.5 and m["perf/teacher_s"] > 0 and "reward/length/mean" in m


OBSERVING_ENV = '''
from polyrl.envs import Step


class EchoEnv:
    """Turn 1: an observation (a user message) comes back; turn 2: a reward by length, done."""

    def __init__(self):
        self.turn = 0

    def start(self, row):
        return [{"role": "user", "content": row.prompt}]

    def step(self, text):
        self.turn += 1
        if self.turn == 1:
            return Step([{"role": "user", "content": "Say it once more."}])
        return Step(reward=float(len(text) % 3), done=True)
'''


def test_observation_tokens_of_episodes_carry_no_teacher_score_or_term(tmp_path, tiny_arch_dir):
    from transformers import AutoTokenizer

    from polyrl.policies.architectures import build_tiny_arch_dir
    from polyrl.trainer.build_arm import build_arm

    (tmp_path / "echo_env.py").write_text(OBSERVING_ENV)
    student = tiny_arch_dir("qwen2")
    teacher = build_tiny_arch_dir("llama", tmp_path / "teacher", seed=1, tokenizer=AutoTokenizer.from_pretrained(str(student)))
    raw = {
        "name": "episodes", "seed": 0, "model": {"path": str(student)}, "data": {"source": "guess_number"},
        "env": {"module": f"{tmp_path / 'echo_env.py'}:EchoEnv", "max_turns": 3, "max_episode_tokens": 200, "stop": ["e"]},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 8, "max_model_len": 512},
        "train": {"steps": 1, "learning_rate": 1e-2, "micro_batch_size": 8},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 1},
        "distill": {"teacher": {"path": str(teacher)}},
    }  # fmt: skip
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        collected = arm.collector.collect(1)
        batch = arm.pipeline.run(collected.rollout, collected.scores)
    finally:
        arm.close()
    observed = 0
    for row, c in enumerate(collected.rollout.completions):
        mask = torch.tensor(c.completion_mask or [1] * len(c.completion_ids), dtype=torch.bool)
        scores = torch.tensor(c.teacher_logprobs)
        observed += int((~mask).sum())
        assert (scores[~mask] == 0).all() and (scores[mask] < 0).all()
        assert (batch.advantages[row, : len(mask)][~mask] == 0).all()
    assert observed > 0  # the episodes did get observation tokens
    assert math.isfinite(batch.metrics["distill/reverse_kl"])
