"""A test environment for training runs on a random tiny policy: guess_number's feedback on the
first turn (so every episode has observation tokens), then on the second turn a reward that
varies with the answer's length, so rewards within a group differ and an update moves the policy
(guess_number alone pays 0 to a policy that never writes the number). The second turn pays at
least 1 (1 + length mod 3) while an episode cut before it (its first turn ran out of tokens) gets
0: with the length alone, a step whose second turns all had lengths ≡ 0 mod 3 (or no second
turn) paid 0 everywhere and trained nothing, and whether that happened hung on the random
draws, which any change of random-number use elsewhere moved. Referenced by file path
(``env.module: <this file>:ShapedGuessEnv``) from the episode tests."""

from __future__ import annotations

from polyrl.envs import Step
from polyrl.envs.builtins.guess_number import GuessNumberEnv
from tests.engine_settings import kv_cache_for


class ShapedGuessEnv(GuessNumberEnv):
    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def step(self, text: str) -> Step:
        self.turn += 1
        step = super().step(text)
        if self.turn >= 2 and not step.done:
            return Step(reward=1.0 + float(len(text) % 3), done=True)
        return step


def episode_experiment(tmp_path, model_dir, engine: str = "hf", *, steps: int = 2, **sections) -> dict:
    """A short training run of :class:`ShapedGuessEnv` episodes on ``model_dir`` (a random tiny
    ChatML model: it never writes its end-of-turn token, so the stop string "e" ends its turns)."""
    config = {
        "name": "episodes",
        "seed": 0,
        "model": {"path": str(model_dir)},
        "data": {"source": "guess_number"},
        "env": {"module": f"{__file__}:ShapedGuessEnv", "max_turns": 3, "max_episode_tokens": 120, "stop": ["e"]},
        "rollout": {
            "engine": engine,
            "prompts_per_step": 2,
            "samples_per_prompt": 4,
            "max_tokens": 8,
            "max_model_len": 512,
            **kv_cache_for(engine),
        },  # fmt: skip
        "train": {"steps": steps, "learning_rate": 5e-2, "micro_batch_size": 8},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 100},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def observation_grad_is_zero(policy, completions) -> bool:
    """A GRPO loss (A = 1) through ``policy`` on ``completions``: its gradient on every observation
    token's log-prob is exactly 0 (and some episode has one), and every policy token's is not."""
    import torch

    from polyrl.algos.objectives import get_objective
    from polyrl.modeling.logprobs import pack_completions, token_logprobs

    packed = pack_completions(completions, pad_token_id=0)
    logprobs, _ = token_logprobs(policy, packed)
    logprobs.retain_grad()
    mask = packed.response_mask.bool()
    loss, _ = get_objective("grpo").fn(
        logprobs, logprobs.detach(), torch.ones_like(logprobs), mask, loss_normalizer=float(mask.sum()), aggregation="token_mean"
    )
    policy.zero_grad(set_to_none=True)
    loss.backward()
    observation = torch.zeros_like(mask)
    for row, c in enumerate(completions):
        observation[row, : len(c.completion_mask)] = torch.tensor([m == 0 for m in c.completion_mask])
    grad = logprobs.grad
    policy.zero_grad(set_to_none=True)
    return bool(observation.any()) and bool(torch.all(grad[observation] == 0)) and bool(torch.all(grad[mask] != 0))


def train_recording(config: dict, arm_dir):
    """Build and run the arm; the episodes of every step (as returned by the runner), the
    history, and the arm (closed) with its policy."""
    from polyrl.config.schema import ExperimentConfig
    from polyrl.trainer.build_arm import build_arm

    arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=arm_dir)
    played = []
    try:
        runner = arm.collector.episodes
        run = runner.run

        def recorded(*args, **kwargs):
            groups = run(*args, **kwargs)
            played.append([c for group in groups for c in group])
            return groups

        runner.run = recorded
        base = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters() if not p.requires_grad}
        adapter = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters() if p.requires_grad}
        history = arm.loop(printer=lambda _: None).run()
    finally:
        arm.close()
    return arm, history, played, base, adapter
