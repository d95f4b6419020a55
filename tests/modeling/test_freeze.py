"""model.freeze (polyrl/modeling/freeze.py): frozen parts never move, the rest trains, the optimizer
holds only trainable parameters, and what names nothing is refused with what the model has."""

from __future__ import annotations

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.config.schema import resolve_arms
from polyrl.core.errors import PolyrlError
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.freeze import FreezeError, freeze_parameters
from polyrl.modeling.logprobs import pack_completions
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.policies.vlm import build_tiny_vlm, build_vlm_tokenizer
from polyrl.rollout.batches import LearnerBatch


def _update(policy) -> dict[str, torch.Tensor]:
    """One GRPO update on a hand-made text batch; returns the parameters before it."""
    objective = get_objective("grpo")
    learner = PolicyLearner(
        policy,
        objective,
        LearnerSettings(
            aggregation=objective.default_aggregation, objective_params=dict(objective.default_params), learning_rate=1e-2
        ),
    )
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in learner.optimizer.param_groups) == len(trainable)
    rows = [([5, 6], [7, 8, 9]), ([5, 6], [10, 11]), ([12], [7]), ([12], [8, 9, 10])]
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in rows
    ]
    packed = pack_completions(completions, pad_token_id=0)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    learner.update(
        LearnerBatch(
            packed=packed, old_logprobs=None, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * packed.response_mask
        )
    )
    return before


def _moved(before, policy) -> set[str]:
    return {n for n, p in policy.named_parameters() if not torch.equal(before[n], p.detach())}


def test_frozen_embeddings_and_first_layer_stay_and_the_rest_trains():
    policy = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    report = freeze_parameters(policy, parts=["embeddings"], first_layers=1)
    frozen = set(report["frozen"])
    assert "model.embed_tokens.weight" in frozen and all(n.startswith(("model.embed_tokens", "model.layers.0.")) for n in frozen)
    assert report["frozen_params"] + report["trainable_params"] == sum(p.numel() for p in policy.parameters())
    before = _update(policy)
    moved = _moved(before, policy)
    assert not moved & frozen  # frozen parameters did not change
    assert any(n.startswith("model.layers.1.") for n in moved) and "lm_head.weight" in moved


def test_a_vlms_vision_tower_and_projector_freeze_by_what_they_are():
    tokenizer = build_vlm_tokenizer()
    policy = build_tiny_vlm(tokenizer)
    report = freeze_parameters(policy, parts=["vision_tower", "projector"])
    frozen = set(report["frozen"])
    assert frozen == {n for n, _ in policy.named_parameters() if n.startswith(("model.vision_model.", "model.connector."))}
    before = _update(policy)  # a text-only batch: the text model trains, the vision side cannot move
    moved = _moved(before, policy)
    assert moved and not moved & frozen and any(n.startswith("model.text_model.layers.") for n in moved)


def test_patterns_freeze_matching_parameters():
    policy = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    report = freeze_parameters(policy, patterns=["*.mlp.*"])
    assert report["frozen"] and all(".mlp." in n for n in report["frozen"])
    assert all(not p.requires_grad for n, p in policy.named_parameters() if ".mlp." in n)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"parts": ["vision_tower"]},
            r"model.freeze.parts: this policy \(Qwen3ForCausalLM\) has no vision_tower; parts it has: embeddings, lm_head",
        ),
        (
            {"patterns": ["model.layer.*"]},
            r"model.freeze.patterns: 'model.layer.\*' matches no parameter; parameter names start with: .*model.layers.0",
        ),
        ({"first_layers": 3}, r"model.freeze.first_layers: 3, but the decoder has 2 layers"),
        ({"patterns": ["*"]}, r"freezes every parameter"),
    ],
)
def test_what_selects_nothing_is_refused_with_what_the_model_has(kwargs, message):
    policy = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    with pytest.raises(FreezeError, match=message):
        freeze_parameters(policy, **kwargs)
    assert all(p.requires_grad for p in policy.parameters())  # a refusal freezes nothing


@pytest.mark.parametrize(
    "model, train, message",
    [
        ({"freeze": {}}, {}, "model.freeze: .*freezes nothing"),
        ({"freeze": {"parts": ["embeddings"]}, "lora": {}}, {}, "freeze and lora together"),
        ({"freeze": {"parts": ["vision"]}}, {}, "model.freeze.parts.0"),
        ({"freeze": {"first_layers": 1}}, {"learner_workers": 2}, "learner_workers: 2 cannot run with model.freeze"),
    ],
)
def test_the_config_refuses_freezes_that_would_do_nothing_or_not_run(model, train, message):
    with pytest.raises(PolyrlError, match=message):
        resolve_arms({"name": "t", "model": model, "train": train})


def test_validate_refuses_a_vision_part_on_a_builtin_text_policy():
    with pytest.raises(PolyrlError, match="text-only; parts it has: embeddings, lm_head"):
        resolve_arms({"name": "t", "model": {"freeze": {"parts": ["vision_tower"]}}})
    assert resolve_arms({"name": "t", "model": {"builtin": {"task": "vqa"}, "freeze": {"parts": ["vision_tower"]}}})


@pytest.mark.slow
def test_a_run_with_model_freeze_keeps_the_frozen_layers(tmp_path, tiny_experiment):
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(
        model={"freeze": {"parts": ["embeddings"], "first_layers": 1}}, train={"steps": 1, "learning_rate": 1e-2}
    )
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        before = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters()}
        arm.loop().run()
        moved = _moved(before, arm.learner.policy)
    finally:
        arm.close()
    assert moved and not any(n.startswith(("model.embed_tokens", "model.layers.0.")) for n in moved)
