"""The critic of an image-text policy: the policy's multimodal architecture with a value head."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoProcessor

from polyrl.config.schema import resolve_arms
from polyrl.core.types import Completion
from polyrl.engines.image_prompts import encode_image_prompt
from polyrl.learner.critic import Critic, CriticSettings, ImageTextValueModel, ValueModel, build_value_model
from polyrl.modeling.logprobs import pack_completions
from polyrl.rollout.batches import LearnerBatch
from polyrl.tasks import scenes
from polyrl.trainer.build_arm import build_arm
from polyrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

TEXT_PROMPT = "Q: 2+2?\nA:"


def _rows(vlm_dir, scene_prompts):
    """Completions: scene A's prompt with its image, the same ids with another scene's image, a text-only row."""
    processor = AutoProcessor.from_pretrained(str(vlm_dir))
    sample = scene_prompts(1)[0]
    _, ids, pixels = encode_image_prompt(processor, sample.prompt, sample.images)
    other = encode_image_prompt(processor, sample.prompt, [scenes.render(scenes.make_scene(5))])[2]
    assert not torch.equal(pixels["pixel_values"], other["pixel_values"])
    answer = processor.tokenizer("red", add_special_tokens=False)["input_ids"]
    text_ids = processor.tokenizer(TEXT_PROMPT, add_special_tokens=False)["input_ids"]

    def row(prompt_ids, images):
        return Completion(
            prompt_ids=list(prompt_ids),
            completion_ids=list(answer),
            text="red",
            sampling_logprobs=[],
            finish_reason="stop",
            image_inputs=images,
        )

    return [row(ids, pixels), row(ids, other), row(text_ids, None)], processor.tokenizer.pad_token_id


def test_the_image_critic_sees_the_image_and_values_text_rows_as_alone(vlm_dir, scene_prompts, random_policy_dir):
    assert isinstance(build_value_model(random_policy_dir, torch.float32), ValueModel)  # text policies: unchanged
    torch.manual_seed(0)  # the head's init
    model = build_value_model(vlm_dir, torch.float32)
    assert isinstance(model, ImageTextValueModel) and "value_head.weight" in model.state_dict()
    assert any(name.startswith("backbone.vision_model.") for name in model.state_dict())
    critic = Critic(model, CriticSettings(micro_batch_size=8))
    completions, pad = _rows(vlm_dir, scene_prompts)
    packed = pack_completions(completions, pad_token_id=pad)
    values = critic.values(packed)
    mask = packed.response_mask.bool()
    assert values.shape == mask.shape and values.dtype == torch.float32 and not values.requires_grad
    assert torch.count_nonzero(values[~mask]) == 0
    # Same ids, other pixels: the values move, so the critic's forward uses the image (5e-4 measured
    # with this seed on the briefly warmed VLM; batch-shape noise is under 1e-6).
    assert (values[0] - values[1])[mask[0]].abs().max() > 1e-4, values
    for row, completion in enumerate(completions):
        alone = critic.values(pack_completions([completion], pad_token_id=pad))[0]
        n = len(completion.completion_ids)
        assert torch.allclose(values[row, :n], alone[:n], atol=1e-5), (row, values[row], alone)


def test_an_image_critic_update_round_trips_through_a_checkpoint(vlm_dir, scene_prompts, tmp_path):
    torch.manual_seed(0)
    critic = Critic(build_value_model(vlm_dir, torch.float32), CriticSettings(learning_rate=1e-2, micro_batch_size=2))
    completions, pad = _rows(vlm_dir, scene_prompts)
    packed = pack_completions(completions, pad_token_id=pad)
    before = {k: v.clone() for k, v in critic.model.state_dict().items()}
    batch = LearnerBatch(
        packed=packed,
        old_logprobs=None,
        advantages=torch.zeros(packed.response_mask.shape),
        old_values=critic.values(packed),
        returns=packed.response_mask.float(),
    )
    metrics = critic.update(batch, torch.arange(len(packed)), {})
    assert math.isfinite(metrics["value/loss"]) and metrics["value/grad_norm"] > 0
    after = critic.model.state_dict()
    assert not torch.equal(before["value_head.weight"], after["value_head.weight"])
    assert any(not torch.equal(before[k], after[k]) for k in after if k.startswith("backbone.vision_model."))
    save_checkpoint(
        tmp_path / "step_000001", step=1, models={"critic": critic.model}, optimizers={"critic": critic.optimizer}, state={}
    )

    torch.manual_seed(1)  # another head init, so only the checkpoint can make them equal
    restored = Critic(build_value_model(vlm_dir, torch.float32), CriticSettings(learning_rate=1e-2, micro_batch_size=2))
    assert not torch.equal(restored.model.state_dict()["value_head.weight"], after["value_head.weight"])
    load_checkpoint(tmp_path / "step_000001", models={"critic": restored.model}, optimizers={"critic": restored.optimizer})
    for key, value in after.items():
        assert torch.equal(restored.model.state_dict()[key], value), key
    assert torch.equal(restored.values(packed), critic.values(packed))
    state, again = critic.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert state.keys() == again.keys() and all(torch.equal(state[i]["exp_avg_sq"], again[i]["exp_avg_sq"]) for i in state)


def _ppo_config(tmp_path, vlm_dir, steps: int) -> dict:
    return {
        "name": "vqa_ppo",
        "seed": 0,
        "model": {"path": str(vlm_dir)},
        "data": {"source": "scenes", "limit": 32},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        "objective": {"name": "ppo"},
        "advantage": {"estimator": "gae"},
        "rewards": [
            {"module": "accuracy", "params": {"extract": "full"}},
            {"module": "length", "weight": 0.01, "params": {"unit": "chars"}},
        ],
        "train": {"steps": steps, "learning_rate": 1e-3, "micro_batch_size": 8, "value": {"learning_rate": 1e-3}},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
    }


@pytest.mark.slow
def test_ppo_on_vqa_trains_the_image_critic_and_resumes_it_exactly(tmp_path, vlm_dir):
    arm_dir = tmp_path / "runs" / "main"
    arm = build_arm(resolve_arms(_ppo_config(tmp_path, vlm_dir, steps=2))["main"], arm="main", arm_dir=arm_dir)
    try:
        assert isinstance(arm.critic.model, ImageTextValueModel)
        before = {k: v.clone() for k, v in arm.critic.model.state_dict().items()}
        history = arm.loop().run()
        trained = {k: v.clone() for k, v in arm.critic.model.state_dict().items()}
        optimizer = arm.critic.optimizer.state_dict()["state"]
    finally:
        arm.close()
    assert len(history) == 2 and all(math.isfinite(h["value/loss"]) and h["value/updates"] >= 1 for h in history)
    assert not torch.equal(before["value_head.weight"], trained["value_head.weight"])
    assert any(not torch.equal(before[k], trained[k]) for k in trained if k.startswith("backbone.vision_model."))
    assert latest_checkpoint(arm_dir).name == "step_000002"

    # A resumed arm (one step more) starts from the checkpointed critic, not a fresh head.
    resumed = build_arm(resolve_arms(_ppo_config(tmp_path, vlm_dir, steps=3))["main"], arm="main", arm_dir=arm_dir, resume=True)
    try:
        assert resumed.start_step == 2
        for key, value in trained.items():
            assert torch.equal(resumed.critic.model.state_dict()[key], value), key
        again = resumed.critic.optimizer.state_dict()["state"]
        assert again.keys() == optimizer.keys() and all(torch.equal(again[i]["exp_avg"], optimizer[i]["exp_avg"]) for i in again)
    finally:
        resumed.close()
