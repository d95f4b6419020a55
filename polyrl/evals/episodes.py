"""Held-out evaluation of episodes: an eval suite's datasets played with the run's environment.

With ``env:`` set, the periodic evaluator (``eval.suite``, :mod:`polyrl.evals.periodic`) plays
each prompt of the suite's datasets as ``generation.n`` episodes with the training run's
environment and budgets (:mod:`polyrl.rollout.episodes`), on the run's own engine, with the suite's
decoding (greedy or sampled). Per dataset, logged as ``eval/<dataset>/<metric>``:

- ``accuracy``: the share of episodes solved: the environment's verdict (``Step.solved``), or a
  return above 0 when it gives none (:func:`polyrl.envs.base.episode_accuracy_value`; polyrl's one
  definition of accuracy, :func:`polyrl.rewards.summary.accuracy_share`);
- ``pass_at_<k>`` for the suite's ``metrics.pass_at_k`` (k <= n): unbiased pass@k with an
  episode counted correct as ``accuracy`` counts it (:mod:`polyrl.evals.passk`);
- ``return_mean`` and every ``episode/*`` metric of training (turns, tool calls and errors,
  tool-call rate, truncation shares).

The suite's reward modules and accuracy settings are not used: the environment scores.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.envs import build_env, load_env_class
from polyrl.envs.base import episode_accuracy_value
from polyrl.evals.example_outcomes import example_id
from polyrl.evals.harness import EvalResult, SuiteRunner
from polyrl.evals.passk import mean_pass_at_k
from polyrl.rewards.summary import accuracy_share, is_correct
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings, episode_metrics

__all__ = ["EpisodeOptions", "EpisodeSuiteRunner"]


@dataclass(frozen=True)
class EpisodeOptions:
    """``polyrl eval --env``: the environment and its budgets (as ``env:`` in a training YAML)."""

    module: str
    params: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_episode_tokens: int = 512
    tool_timeout_s: float = 5.0
    tool_output_chars: int = 2000
    tool_format: str = "auto"
    stop: tuple[str, ...] = ()

    def runner_factory(self, *, max_model_len: int | None, system_prompt: str | None = None) -> Callable[[Any], EpisodeRunner]:
        """``make_runner(tokenizer)`` for :class:`EpisodeSuiteRunner`; the reference and params are
        checked now (raises :class:`polyrl.envs.EnvConfigError` naming them)."""
        cls = load_env_class(self.module)
        build_env(cls, dict(self.params), ref=self.module)
        settings = EpisodeSettings(
            max_turns=self.max_turns, max_episode_tokens=self.max_episode_tokens, tool_timeout_s=self.tool_timeout_s,
            tool_output_chars=self.tool_output_chars, tool_format=self.tool_format,  # type: ignore[arg-type]
            system_prompt=system_prompt, env_name=self.module, stop=tuple(self.stop),
        )  # fmt: skip
        return lambda tokenizer: EpisodeRunner(
            lambda: build_env(cls, dict(self.params), ref=self.module), tokenizer, settings, max_model_len=max_model_len
        )


class EpisodeSuiteRunner:
    """``suite``'s datasets played as episodes; ``make_runner(tokenizer)`` builds the episode
    runner for the engine's tokenizer (once per tokenizer)."""

    def __init__(self, suite: SuiteRunner, make_runner: Callable[[Any], EpisodeRunner]):
        self.suite_runner = suite
        self.make_runner = make_runner
        self._runner: EpisodeRunner | None = None
        self._tokenizer: Any = None

    @property
    def datasets(self) -> list[Any]:
        return self.suite_runner.datasets

    @property
    def suite(self) -> Any:
        return self.suite_runner.suite

    def check_model(self, model_dir: Any, *, field: str = "--model") -> None:
        self.suite_runner.check_model(model_dir, field=field)

    def run(self, engine: Any) -> EvalResult:
        started = time.perf_counter()
        tokenizer = engine.tokenizer
        if self._runner is None or self._tokenizer is not tokenizer:
            self._runner, self._tokenizer = self.make_runner(tokenizer), tokenizer
        settings = self.suite_runner.settings
        n = settings.n
        metrics: dict[str, float] = {}
        rows: list[dict[str, Any]] = []
        counts: dict[str, dict[str, int]] = {}
        for data in self.datasets:
            groups = self._runner.run(engine, list(data.samples), settings)
            completions = [c for group in groups for c in group]
            returns: list[float | None] = [c.episode["return"] for c in completions]
            solved = [episode_accuracy_value(c.episode) for c in completions]
            out = {"accuracy": accuracy_share(solved), "return_mean": sum(returns) / max(len(returns), 1)}
            problems = [(n, sum(is_correct(v) for v in solved[i : i + n])) for i in range(0, len(solved), n)]
            for k in self.suite_runner.suite.metrics.pass_at_k:
                if k <= n:
                    out[f"pass_at_{k}"] = mean_pass_at_k(problems, k)
            out.update(episode_metrics(completions))
            metrics.update({f"{data.spec.label}/{key}": value for key, value in out.items()})
            ids = [example_id(sample) for sample in data.samples]
            for index, completion in enumerate(completions):
                sample = data.samples[index // n]
                rows.append({
                    "dataset": data.spec.label, "prompt_index": index // n, "sample_index": index % n,
                    "id": str(sample.fields.get("id", index // n)), "example_id": ids[index // n], "prompt": sample.prompt,
                    "completion": completion.text, "reward": returns[index], "correct": solved[index],
                    "length": completion.policy_length, "finish_reason": completion.finish_reason,
                    "episode": json.dumps(completion.episode),
                })  # fmt: skip
            counts[data.spec.label] = {"prompts": len(data.samples), "samples": len(completions)}
        images = [[] for _ in rows]
        return EvalResult(self.suite_runner.suite.name, metrics, rows, counts, time.perf_counter() - started, row_images=images)
