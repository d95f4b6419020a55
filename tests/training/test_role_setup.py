"""The arm set-up's config decisions, alone: which reward gets the policy's path (declared by
the reward, not guessed from its constructor), which reward defines train/accuracy, and the
same declaration read by preflight."""

from __future__ import annotations

import pytest

from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.launch.preflight_rewards import reward_problems
from polyrl.rewards import RewardSpec
from polyrl.trainer.build_data import accuracy_label, reward_specs

REWARD_FILE = '''
class TakesModelPath:
    """Has a model_path parameter but does not declare that it wants the policy's."""
    name = "takes_model_path"

    def __init__(self, model_path=None):
        if model_path is not None:
            raise ValueError("takes_model_path: model_path is its own scoring model, never the policy")

    def score(self, batch):
        return [0.0] * len(batch)


class WantsPolicy(TakesModelPath):
    name = "wants_policy"
    policy_path_param = "model_path"

    def __init__(self, model_path=None):
        self.model_path = model_path
'''


def test_only_a_reward_that_declares_it_gets_the_policy_path(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    rewards = [
        {"module": "ppl_fluency"},
        {"module": "ppl_fluency", "name": "own", "params": {"model_path": "/own"}},
        {"module": f"{tmp_path}/my_rewards.py:TakesModelPath"},
        {"module": f"{tmp_path}/my_rewards.py:WantsPolicy"},
        {"module": "length"},
    ]
    specs = reward_specs(ExperimentConfig(name="t", rewards=rewards), "/policy")
    assert [spec.params.get("model_path") for spec in specs] == ["/policy", "/own", None, "/policy", None]


def test_a_built_in_model_named_for_the_scoring_model_becomes_its_cached_folder(monkeypatch):
    import polyrl.policies.pretrained as pretrained

    # pretrained_dir converts the packaged GGUF once (its own tests); here only who calls it, with what.
    calls = []
    monkeypatch.setattr(
        pretrained, "pretrained_dir", lambda name, cache_dir=None: calls.append((name, cache_dir)) or f"/cache/{name}"
    )
    rewards = [{"module": "ppl_fluency", "params": {"model_path": "smollm2-135m-instruct"}},
               {"module": "ppl_fluency", "name": "own", "params": {"model_path": "/own"}}]  # fmt: skip
    config = ExperimentConfig(name="t", rewards=rewards, model={"cache_dir": "/models"})
    specs = reward_specs(config, "/policy")
    assert [spec.params["model_path"] for spec in specs] == ["/cache/smollm2-135m-instruct", "/own"]
    assert calls == [("smollm2-135m-instruct", "/models")]
    # The preflight accepts the name (the package that ships it is installed here).
    assert reward_problems([RewardSpec(**rewards[0])], model_path="/policy") == []


def test_preflight_reads_the_same_declaration(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    undeclared = RewardSpec(module=f"{tmp_path}/my_rewards.py:TakesModelPath")
    declared = RewardSpec(module=f"{tmp_path}/my_rewards.py:WantsPolicy")
    # The policy's path goes to the declared reward only (a guess from the constructor's
    # parameters would hand it to TakesModelPath too, which refuses it).
    assert reward_problems([undeclared, declared], model_path="/policy") == []


def test_a_reward_that_would_score_with_an_image_text_policy_is_refused_at_preflight(tmp_path):
    # ppl_fluency without model_path loads the policy's folder as a causal LM: an Idefics3 caption
    # policy failed only once the runs had started (transformers' "Unrecognized configuration class").
    from polyrl.launch.preflight import arm_problems

    image_text = ExperimentConfig(
        name="t", model={"builtin": {"task": "caption"}}, data={"source": "scenes_captions"},
        rewards=[{"module": "cider"}, {"module": "ppl_fluency", "name": "fluency"}],
    )  # fmt: skip
    problems = arm_problems(image_text)
    assert any(p.startswith("rewards[1].params.model_path: 'fluency'") and "image-text" in p for p in problems), problems
    # With a text model named, or on a text policy, nothing is refused for it.
    named = image_text.model_copy(update={"rewards": [RewardSpec(module="ppl_fluency", params={"model_path": str(tmp_path)})]})
    assert not any("image-text" in p for p in arm_problems(named))
    assert reward_problems([RewardSpec(module="ppl_fluency")], model_path="/policy") == []


def test_accuracy_comes_from_the_named_reward_else_the_documented_default():
    assert accuracy_label(ExperimentConfig(name="t", tracking={"accuracy_reward": "verifier"}), ["len", "verifier"]) == "verifier"
    assert accuracy_label(ExperimentConfig(name="t"), ["accuracy", "len"]) == "accuracy"
    assert accuracy_label(ExperimentConfig(name="t"), ["len"]) is None
    with pytest.raises(ConfigError, match=r"tracking\.accuracy_reward: no reward is labelled 'x'; reward labels: len"):
        accuracy_label(ExperimentConfig(name="t", tracking={"accuracy_reward": "x"}), ["len"])
