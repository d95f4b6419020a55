"""polyrl's own composite reward (accuracy + 0.3·fluency + safety + 0.1·length) from its YAML."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from polyrl.policies.text import build_random_text_model_dir
from polyrl.rewards import CompositeReward, RewardBatch, RewardSpec

YAML_PATH = Path(__file__).resolve().parents[2] / "experiments" / "snippets" / "seed_composite_reward.yaml"


def manual_fluency(model, tokenizer, prompt, completion):
    """min(0, (50 - ppl)/10) with ppl from an unpadded forward pass over prompt + completion."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    nll = [-float(log_probs[t - 1, ids[0, t]]) for t in range(len(prompt_ids), ids.shape[1])]
    return min(0.0, (50.0 - math.exp(sum(nll) / len(nll))) / 10.0)


def test_seed_composite_totals(tmp_path):
    model_dir = str(build_random_text_model_dir(tmp_path / "scorer", "0.3m"))
    config = yaml.safe_load(YAML_PATH.read_text())
    specs = [RewardSpec.model_validate(entry) for entry in config["rewards"]]
    assert [(s.name or s.module, s.weight) for s in specs] == [
        ("accuracy", 1.0),
        ("fluency", 0.3),
        ("safety", 1.0),
        ("length", 0.1),
    ]
    specs[1].params.update(model_path=model_dir, device="cpu")  # the trainer fills in model_path
    reward = CompositeReward(specs)
    batch = RewardBatch(
        prompts=["Translate: 我喜欢吃苹果", "Reply politely", "Free text"],
        completions=["I like apples", "I will kill you", "whatever"],
        references=[["I like eating apples"], ["I will help you"], []],
    )
    result = reward.score(batch)
    fluency = reward.modules["fluency"]
    f0, f1 = (manual_fluency(fluency.model, fluency.tokenizer, batch.prompts[i], batch.completions[i]) for i in (0, 1))

    # Sample 0: ROUGE-L [i, like, apples] vs [i, like, eating, apples]: LCS 3, P = 1, R = 3/4
    #   -> F = 2*1*0.75/1.75 = 6/7; safety 0 (nothing fires); length 13 chars / 100 = 0.13
    #   total = 6/7 + 0.3*f0 + 0 + 0.1*0.13
    # Sample 1: [i, will, kill, you] vs [i, will, help, you]: LCS 3 -> P = R = 3/4 -> F = 0.75
    #   safety -10 ("kill you"); length 15 chars / 100 = 0.15
    #   total = 0.75 + 0.3*f1 - 10 + 0.1*0.15
    # Sample 2: no reference -> accuracy None -> total None
    assert result.per_module["accuracy"] == pytest.approx([6 / 7, 0.75, None], abs=1e-12)
    assert result.per_module["safety"] == [0.0, -10.0, 0.0]
    assert result.per_module["length"] == pytest.approx([0.13, 0.15, 0.08], abs=1e-12)
    assert result.per_module["fluency"][:2] == pytest.approx([f0, f1], rel=1e-5)
    assert f0 < 0 and f1 < 0  # a random tiny model is far above perplexity 50
    assert result.totals[0] == pytest.approx(6 / 7 + 0.3 * f0 + 0.0 + 0.1 * 0.13, rel=1e-5)
    assert result.totals[1] == pytest.approx(0.75 + 0.3 * f1 - 10.0 + 0.1 * 0.15, rel=1e-5)
    assert result.totals[2] is None
    metrics = result.metrics()
    assert metrics["reward/unscored"] == 1.0 and metrics["reward/accuracy/unscored"] == 1.0
    assert metrics["reward/safety/mean"] == pytest.approx(-10 / 3, abs=1e-12)  # (0 - 10 + 0)/3
