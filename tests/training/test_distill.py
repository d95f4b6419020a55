"""On-policy distillation without training: the per-token reverse KL by hand, the pipeline stage
(added to a task reward's advantage, alone, and never on an episode's observation tokens), the
teacher's scores against a plain transformers forward, and the refusals (config, tokenizers)."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.advantages import get_advantage
from polyrl.algos.distill import reverse_kl_advantages
from polyrl.config.schema import ConfigError, ExperimentConfig, resolve_arms
from polyrl.core.types import Completion, PromptSample
from polyrl.rollout.batches import Rollout, Scores
from polyrl.trainer.pipeline import STAGES, PipelineContext, advantages, pipeline_stages, run_pipeline, teacher_advantages


def test_reverse_kl_advantages_by_hand():
    student = torch.tensor([[-1.0, -2.0, -0.5]])
    teacher = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    adv, metrics = reverse_kl_advantages(student, teacher, mask, coef=2.0)
    # reverse KL per token = log π_s − log π_t: -1 - (-1.5) = 0.5; -2 - (-1) = -1.0; masked: 0.
    # advantage = −coef × KL = −2 × 0.5 = −1.0; −2 × −1.0 = 2.0; 0 off the mask.
    assert adv[0].tolist() == pytest.approx([-1.0, 2.0, 0.0])
    # mean over the 2 masked tokens: (0.5 − 1.0) / 2 = −0.25; percentiles of [−1.0, 0.5] (linear):
    # p10 = −1.0 + 0.1 × 1.5 = −0.85, p50 = −0.25, p90 = −1.0 + 0.9 × 1.5 = 0.35.
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.25)
    assert metrics["distill/reverse_kl_p10"] == pytest.approx(-0.85)
    assert metrics["distill/reverse_kl_p50"] == pytest.approx(-0.25)
    assert metrics["distill/reverse_kl_p90"] == pytest.approx(0.35)
    # the teacher's mean log-prob of the 2 masked tokens: (−1.5 − 1.0) / 2 = −1.25.
    assert metrics["distill/teacher_logprob"] == pytest.approx(-1.25)


def _completion(student, teacher, mask=()) -> Completion:
    n = len(student)
    return Completion(prompt_ids=[1, 2], completion_ids=list(range(5, 5 + n)), text="x" * n, sampling_logprobs=list(student),
                      finish_reason="stop", completion_mask=tuple(mask), teacher_logprobs=tuple(teacher))  # fmt: skip


def _context(distill: dict) -> PipelineContext:
    estimator = get_advantage("group_norm")
    config = ExperimentConfig(name="t", distill=distill)
    return PipelineContext(estimator=estimator, estimator_params=dict(estimator.default_params), pad_token_id=0,
                           modalities=config.modalities, max_tokens=8, distill=config.distill)  # fmt: skip


def _rollout(*completions) -> Rollout:
    return Rollout(
        [PromptSample(prompt="p")] * len(completions), list(completions), torch.zeros(len(completions), dtype=torch.long)
    )


def test_the_teacher_term_is_added_to_the_task_advantage():
    rollout = _rollout(_completion([-1.0, -1.0], [-0.5, -2.0]), _completion([-1.0], [-1.0]))
    ctx = _context({"teacher": {"path": "/teacher"}, "coef": 0.5})
    batch = run_pipeline(rollout, Scores([1.0, 0.0], {}), ctx, pipeline_stages(ctx.distill))
    # Group of 2 with rewards 1 and 0: group-normalised ±0.7071 on each token (mean 0.5, unbiased std 0.7071).
    # Teacher term −0.5 × (log π_s − log π_t): row 0: −0.5 × (−1 + 0.5) = 0.25, −0.5 × (−1 + 2) = −0.5; row 1: 0.
    assert batch.advantages[0].tolist() == pytest.approx([0.70711 + 0.25, 0.70711 - 0.5], abs=1e-4)
    assert batch.advantages[1].tolist() == pytest.approx([-0.70711, 0.0], abs=1e-4)
    # KL per token: −0.5, 1.0 and 0.0 → mean 0.5 / 3.
    assert batch.metrics["distill/reverse_kl"] == pytest.approx(0.5 / 3)


def test_pure_distillation_advantage_is_the_teacher_term_alone():
    ctx = _context({"teacher": {"path": "/teacher"}, "task_reward": False})
    stages = pipeline_stages(ctx.distill)
    assert advantages not in stages and teacher_advantages in stages and len(stages) == len(STAGES) - 1
    rollout = _rollout(_completion([-1.0, -1.0], [-0.5, -2.0]), _completion([-1.0], [-3.0]))
    batch = run_pipeline(rollout, Scores([1.0, 0.0], {}), ctx, stages)
    # −1 × (−1 + 0.5) = 0.5, −1 × (−1 + 2) = −1.0; row 1: −1 × (−1 + 3) = −2.0; the rewards play no part.
    assert batch.advantages[0].tolist() == pytest.approx([0.5, -1.0])
    assert batch.advantages[1].tolist() == pytest.approx([-2.0, 0.0])
    assert batch.metrics["advantage/mean"] == pytest.approx((0.5 - 1.0 - 2.0) / 3)


@pytest.mark.parametrize("task_reward", [True, False])
def test_observation_tokens_of_an_episode_get_no_teacher_term(task_reward):
    # Tokens 3 and 4 are an observation (tool output): no policy sampled them, so no term and no KL.
    episode = _completion([-1.0, -1.0, 0.0, 0.0, -2.0], [-2.0, -0.5, -7.0, -9.0, -1.0], mask=(1, 1, 0, 0, 1))
    ctx = _context({"teacher": {"path": "/teacher"}, "task_reward": task_reward})
    batch = run_pipeline(
        _rollout(episode, _completion([-1.0], [-1.0])), Scores([1.0, 1.0], {}), ctx, pipeline_stages(ctx.distill)
    )
    # Equal rewards: the group-normalised part is 0 on both rows, so both modes give the teacher term alone:
    # −(−1 + 2) = −1.0, −(−1 + 0.5) = 0.5, observations 0, −(−2 + 1) = 1.0.
    assert batch.advantages[0].tolist() == pytest.approx([-1.0, 0.5, 0.0, 0.0, 1.0])
    # KL over the 4 policy tokens (3 of the episode's, 1 of row 1's): (1.0 − 0.5 − 1.0 + 0.0) / 4.
    assert batch.metrics["distill/reverse_kl"] == pytest.approx(-0.5 / 4)


def test_rows_without_teacher_scores_are_refused_not_trained_as_zero():
    ctx = _context({"teacher": {"path": "/teacher"}})
    unscored = Completion(prompt_ids=[1], completion_ids=[5, 6], text="ab", sampling_logprobs=[-1.0, -1.0], finish_reason="stop")
    with pytest.raises(ValueError, match=r"distill: completions \[0\] carry no teacher log-probs"):
        run_pipeline(_rollout(unscored), Scores([1.0], {}), ctx, pipeline_stages(ctx.distill))


def test_the_teacher_scores_each_token_as_a_plain_forward_does(random_policy_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from polyrl.policies.text import build_random_text_model_dir
    from polyrl.rollout.teacher import Teacher

    teacher_dir = build_random_text_model_dir(tmp_path / "teacher", "0.3m", seed=1)
    teacher = Teacher.load(teacher_dir, pad_token_id=0, temperature=0.7, micro_batch_size=1)
    rows = [Completion([3, 4, 5], [6, 7], "", [-1.0, -1.0], "stop"), Completion([3], [8, 9, 10], "", [-1.0] * 3, "stop")]
    scored = teacher.score(rows)
    plain = AutoModelForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32).eval()
    for row in scored:
        ids = torch.tensor([row.prompt_ids + row.completion_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(plain(ids).logits[0] / 0.7, dim=-1)
        n = len(row.prompt_ids)
        # Completion token t is predicted at position n − 1 + t.
        expected = [float(logprobs[n - 1 + t, token]) for t, token in enumerate(row.completion_ids)]
        assert list(row.teacher_logprobs) == pytest.approx(expected, abs=1e-5)
    assert rows[0].teacher_logprobs == ()  # the inputs are left as they were


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path, tiny_experiment, random_policy_dir, tiny_arch_dir):
    from polyrl.trainer.build_arm import build_arm

    teacher_dir = tiny_arch_dir("qwen2")  # a BPE tokenizer; the student's is the character one
    raw = tiny_experiment(distill={"teacher": {"path": str(teacher_dir)}})
    with pytest.raises(ConfigError, match="does not share the student's tokenizer") as refused:
        build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    message = str(refused.value)
    assert str(teacher_dir) in message and str(random_policy_dir) in message and "cross-tokenizer" in message


def test_tokenizers_that_agree_pass_and_one_that_splits_text_otherwise_does_not(tiny_arch_dir, tmp_path):
    from transformers import AutoTokenizer

    from polyrl.policies.architectures import build_tiny_arch_dir
    from polyrl.rollout.teacher import check_same_tokenizer

    student = tiny_arch_dir("qwen2")
    loaded = AutoTokenizer.from_pretrained(str(student))
    # Another architecture saved with the student's tokenizer as loaded: a llama may teach a qwen2.
    teacher = build_tiny_arch_dir("llama", tmp_path / "llama", seed=1, tokenizer=loaded)
    check_same_tokenizer(loaded, AutoTokenizer.from_pretrained(str(teacher)), student_path=student, teacher_path=teacher)
    # The fixture's llama has the same vocabulary, but its folder loads as a llama tokenizer, which
    # joins a space and the digit after it into one token (" 17" is other ids): refused, the probe text says why.
    other = tiny_arch_dir("llama")
    with pytest.raises(ConfigError, match="the probe text"):
        check_same_tokenizer(loaded, AutoTokenizer.from_pretrained(str(other)), student_path=student, teacher_path=other)


@pytest.mark.parametrize(
    ("distill", "extra", "path", "says"),
    [
        ({"teacher": {}}, {}, "distill.teacher", "exactly one way, got 0"),
        ({"teacher": {"path": "a", "run": "b"}}, {}, "distill.teacher", "exactly one way, got 2 (path, run)"),
        ({"teacher": {"run": "abc@last"}}, {}, "distill.teacher.run", "<run_id>@<step>"),
        ({"teacher": {"builtin": {"task": "vqa"}}}, {}, "distill.teacher", "image-text model"),
        ({"teacher": {"path": "a"}, "coef": 0}, {}, "distill.coef", "greater than 0"),
        ({"teacher": {"path": "a"}, "engine": "vllm"}, {}, "distill.engine", "'hf'"),
        ({"teacher": {"path": "a"}, "task_reward": False}, {"objective": {"name": "ppo"}}, "advantage.estimator", "critic"),
        ({"teacher": {"path": "a"}, "task_reward": False}, {"advantage": {"params": {"eps": 0.1}}}, "advantage.params",
         "no estimator runs"),
        ({"teacher": {"path": "a"}, "task_reward": False}, {"advantage": {"dynamic_sampling": {"enabled": True}}},
         "advantage.dynamic_sampling.enabled", "rewards train nothing"),
        ({"teacher": {"path": "a"}, "task_reward": False}, {"advantage": {"overlong": {"mode": "soft_punishment"}}},
         "advantage.overlong.mode", "shapes the reward"),
    ],
)  # fmt: skip
def test_distill_settings_that_cannot_act_are_refused(distill, extra, path, says):
    with pytest.raises(ConfigError) as refused:
        resolve_arms({"name": "d", "rollout": {"engine": "hf"}, "distill": distill, **extra})
    line = next(line for line in str(refused.value).splitlines() if line.strip().startswith(f"- {path}:"))
    assert says in line


def test_a_run_reference_parses_with_or_without_its_prefix():
    from polyrl.config.distill import parse_teacher_run

    assert parse_teacher_run("abc123") == ("abc123", None)
    assert parse_teacher_run("run:abc123@40") == ("abc123", 40)
    config = resolve_arms({"name": "d", "distill": {"teacher": {"run": "run:abc@4"}}})["main"]
    assert config.distill.teacher.run == "run:abc@4" and config.distill.task_reward and math.isclose(config.distill.coef, 1.0)
