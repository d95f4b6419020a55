"""The episode rollout: multi-turn episodes with an environment, token in and token out.

One episode per (prompt, sample): the environment starts it from the data row (its first
messages, rendered through the tokenizer's chat template with the generation prompt); then,
turn after turn, the policy answers and the environment replies (:mod:`polyrl.envs`).

Token in, token out. The policy's tokens are kept exactly as the engine sampled them, with their
sampling log-probs; nothing the policy generated is ever re-tokenised from text. An observation
(tool result, user message, feedback) is rendered through the chat template as the DIFFERENCE
between the templated conversation with and without it, and only that difference is encoded
and appended. The template's own closing of the assistant turn that the policy did not sample
(e.g. the ``\\n`` after ``<|im_end|>`` in ChatML, or the end-of-turn token itself after an
``env.stop`` string) is part of that difference (:mod:`polyrl.rollout.chat_render`). Every appended
token is an observation token: mask 0, log-prob 0, no gradient, no length
(:attr:`polyrl.core.types.Completion.completion_mask`). The learner therefore scores the very ids
the sampler produced: ``prompt_ids + completion_ids`` of the returned completion.

Each turn of all live episodes is ONE batched ``engine.generate`` call (HF or vLLM; vLLM's prefix
cache, on by default, reuses the shared history; a pool of ``rollout.workers`` spreads it over its
workers); finished episodes leave the batch. With ``rollout.max_staleness`` a weight sync may fall
between two turns: the episode carries its first turn's policy version (the oldest) and records
both ends (``policy_versions``); every policy token keeps the log-prob of the weights that sampled it.

Budgets and the truncation rule. An episode ends
- ``done``: the environment said so (``finish_reason == "stop"``);
- truncated (``finish_reason == "length"``), when any of: a turn hit ``rollout.max_tokens``
  (cut mid-answer: the environment does not see it); the episode's tokens after its first prompt
  (policy and observation) reached ``max_episode_tokens`` (the policy's last tokens are cut to
  the budget; an observation that would not fit is not appended); ``max_turns`` assistant turns
  passed without ``done``; the context would outgrow the engine's ``max_model_len``.
The return is the sum of the rewards the environment gave (``None`` counts 0), truncated or not.

The environment's own code (``start``, ``step``) runs on a time budget (``env.step_timeout_s``);
an exception, ``sys.exit``, time-out or a reward that is not a finite number stops the run with
one message naming the environment, the method, the row and the turn (:mod:`polyrl.envs.calls`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.envs import EnvConfigError, EpisodeRow, Step, checked_messages
from polyrl.envs.base import EnvFailedError, checked_reward
from polyrl.envs.calls import DEFAULT_STEP_TIMEOUT_S, call_env, env_source, row_words, snippet
from polyrl.rollout.chat_render import ChatRenderer

__all__ = ["ChatRenderer", "EpisodeRunner", "EpisodeSettings", "episode_metrics"]


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 4
    max_episode_tokens: int = 512
    tool_timeout_s: float = 5.0
    tool_output_chars: int = 2000
    # Where tool calls run (env.tool_sandbox; polyrl.envs.sandbox.SandboxSettings). None: a worker
    # process with the default limits.
    tool_sandbox: Any = None
    tool_format: Literal["auto", "template", "text"] = "auto"
    system_prompt: str | None = None
    env_name: str = "env"  # for error messages
    # Stop strings that also end an assistant turn (e.g. "</tool_call>"), besides end of turn/EOS.
    stop: tuple[str, ...] = ()
    # How calls are parsed: auto (what the prompt asks for), hermes or llama3_json (polyrl.envs.tools).
    tool_parser: str = "auto"
    # The time budget of one start(row) or step(text) call (None: none); past it the run stops.
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S


@dataclass
class _Episode:
    env: Any
    group: int
    row: str  # the data row in words, for error messages
    history: list[dict[str, Any]]
    prompt_text: str
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    solved: bool | None = None  # the environment's last verdict (Step.solved)
    assistant_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    finish: str | None = None  # "stop" (done) or "length" (truncated)
    end: str = ""  # why it ended
    last_text: str = ""
    # The weights version of its first turn and of its last: a weight sync between two turns
    # (asynchronous training) gives later turns newer weights. The episode carries the first,
    # the oldest, so the staleness bound and metrics are never understated; each policy token's
    # sampling log-prob is that of the weights that sampled it, so π_old stays exact.
    policy_version: int | None = None
    last_version: int | None = None

    def append(self, ids: Sequence[int], logprobs: Sequence[float], trained: bool) -> None:
        self.tokens += list(ids)
        self.mask += [int(trained)] * len(ids)
        self.logprobs += list(logprobs) if trained else [0.0] * len(ids)

    def close(self, finish: str, end: str) -> None:
        self.finish, self.end = finish, end


class EpisodeRunner:
    """Plays ``settings.n`` episodes per prompt on an engine (see the module docstring).

    ``make_env()`` returns a fresh environment for each episode."""

    def __init__(
        self, make_env: Callable[[], Any], tokenizer: Any, settings: EpisodeSettings, *, max_model_len: int | None = None
    ):
        self.make_env = make_env
        self.tokenizer = tokenizer
        self.settings = settings
        self.max_model_len = max_model_len
        probe = make_env()
        self.renderer = ChatRenderer(tokenizer, getattr(probe, "tools", []) or [], settings.tool_format,
                                     settings.system_prompt, tool_parser=settings.tool_parser)  # fmt: skip
        # How tools are offered and calls parsed, in one sentence (None without tools): the run says it first.
        self.tool_note = self.renderer.tool_note

    def _new_episode(self, prompt: PromptSample, group: int) -> _Episode:
        s = self.settings
        env = self.make_env()
        if hasattr(env, "tool_timeout_s"):
            env.tool_timeout_s, env.tool_output_chars = s.tool_timeout_s, s.tool_output_chars
        if hasattr(env, "tool_sandbox"):
            env.tool_sandbox = s.tool_sandbox
        if hasattr(env, "tool_parser"):
            env.tool_parser = self.renderer.tool_parser
        row = EpisodeRow(prompt.prompt, list(prompt.references), dict(prompt.fields))
        words = row_words(prompt.prompt, prompt.fields, group)
        started = call_env(env.start, row, env_name=s.env_name, method="start(row)", where=words,
                           timeout_s=s.step_timeout_s, source=env_source(env))  # fmt: skip
        messages = checked_messages(started, where=f"{s.env_name}.start(row) on {words}", last_user=True)
        messages = self.renderer.first_messages(messages)
        text = self.renderer.render(messages, generation_prompt=True)
        episode = _Episode(env, group, words, messages, text, self.renderer.encode(text))
        episode.turns = [{"role": m["role"], "content": m["content"], "trained": False, "tokens": 0} for m in messages]
        episode.turns[-1]["tokens"] = len(episode.prompt_ids)  # the whole first prompt, for the record
        return episode

    def run(self, engine: Any, prompts: list[PromptSample], sampling: SamplingSettings) -> list[list[Completion]]:
        """``sampling.n`` episodes per prompt, grouped per prompt, in prompt order."""
        episodes = [self._new_episode(p, i) for i, p in enumerate(prompts) for _ in range(sampling.n)]
        live = list(episodes)
        turn = 0
        while live:
            fits = []
            for ep in live:
                context = len(ep.prompt_ids) + len(ep.tokens)
                if self.max_model_len is not None and context + sampling.max_tokens > self.max_model_len:
                    ep.close("length", "max_model_len")
                else:
                    fits.append(ep)
            live = fits
            if not live:
                break
            seed = None if sampling.seed is None else sampling.seed * 7919 + turn
            call = SamplingSettings(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                                    max_tokens=sampling.max_tokens, seed=seed, stop=[*sampling.stop, *self.settings.stop])  # fmt: skip
            requests = [PromptSample(prompt=ep.prompt_text, prompt_ids=ep.prompt_ids + ep.tokens) for ep in live]
            outputs = engine.generate(requests, call)
            for ep, group in zip(live, outputs):
                self._take_turn(ep, group[0])
            live = [ep for ep in live if ep.finish is None]
            turn += 1
        grouped: list[list[Completion]] = [[] for _ in prompts]
        for ep in episodes:
            grouped[ep.group].append(self._completion(ep))
        return grouped

    def _take_turn(self, ep: _Episode, sample: Completion) -> None:
        s = self.settings
        if ep.policy_version is None:
            ep.policy_version = sample.policy_version
        ep.last_version = sample.policy_version
        room = s.max_episode_tokens - len(ep.tokens)
        ids, logprobs = list(sample.completion_ids), list(sample.sampling_logprobs)
        cut = len(ids) > room
        if cut:
            ids, logprobs = ids[:room], logprobs[:room]
        ep.append(ids, logprobs, trained=True)
        ep.assistant_turns += 1
        text = self._turn_text(sample)
        ep.last_text = text
        record = {"role": "assistant", "content": text, "trained": True, "tokens": len(ids), "reward": None}
        ep.turns.append(record)
        if cut or sample.truncated:
            ep.close("length", "max_episode_tokens" if cut else "max_tokens")
            return
        step, reward = self._step(ep, text)
        record.update(reward=reward, tool_calls=step.tool_calls, tool_errors=step.tool_errors)
        ep.rewards.append(reward)
        if step.solved is not None:
            ep.solved = bool(step.solved)
        ep.tool_calls += step.tool_calls
        ep.tool_errors += step.tool_errors
        if step.done:
            ep.close("stop", "done")
            return
        if ep.assistant_turns >= s.max_turns:
            ep.close("length", "max_turns")
            return
        where = f"{s.env_name}.step(text) on turn {ep.assistant_turns} of {ep.row}"
        observation = checked_messages(step.observation, where=f"{where}: observation")
        if not observation:
            raise EnvConfigError(f"{where}: the episode goes on (done=False) but the observation is empty")
        ids, ep.history = self.renderer.observation_ids(ep.history, text, list(sample.completion_ids), observation)
        if len(ep.tokens) + len(ids) >= s.max_episode_tokens:
            ep.close("length", "max_episode_tokens")
            return
        ep.append(ids, [], trained=False)
        for message in observation:
            ep.turns.append({"role": message["role"], "content": message["content"], "trained": False, "tokens": 0})
        ep.turns[-1]["tokens"] = len(ids)  # the observation's tokens (with the turn's closing), on its last message

    def _turn_text(self, sample: Completion) -> str:
        """The turn's text as the environment reads it: the engine's text (stop token removed),
        with an episode stop string that ended the turn kept (``</tool_call>`` closes a call the
        environment must parse); the engines cut text before a stop string."""
        if not self.settings.stop:
            return sample.text
        full = self.tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
        rest = full[len(sample.text) :] if full.startswith(sample.text) else ""
        for stop in self.settings.stop:
            if rest.startswith(stop):
                return sample.text + stop
        return sample.text

    def _step(self, ep: _Episode, text: str) -> tuple[Step, float | None]:
        """``env.step(text)`` on its time budget, and its reward held to the reward modules' rule."""
        s = self.settings
        where = f"turn {ep.assistant_turns} of {ep.row}, after the assistant wrote {snippet(text)}"
        step = call_env(ep.env.step, text, env_name=s.env_name, method="step(text)", where=where,
                        timeout_s=s.step_timeout_s, source=env_source(ep.env))  # fmt: skip
        if not isinstance(step, Step):
            raise EnvFailedError(
                f"environment {s.env_name!r}: step(text) on {where} must return a polyrl.envs.Step, got {type(step).__name__}"
            )
        return step, checked_reward(step.reward, where=f"environment {s.env_name!r}: step(text) on {where}")

    def _completion(self, ep: _Episode) -> Completion:
        total = float(sum(r for r in ep.rewards if r is not None))
        record = {
            "turns": ep.turns,
            "return": total,
            "solved": ep.solved,
            "assistant_turns": ep.assistant_turns,
            "tool_calls": ep.tool_calls,
            "tool_errors": ep.tool_errors,
            "end": ep.end,
            "observation_tokens": len(ep.mask) - sum(ep.mask),
            "policy_versions": [ep.policy_version, ep.last_version],
        }
        return Completion(
            prompt_ids=ep.prompt_ids,
            completion_ids=ep.tokens,
            text=ep.last_text,
            sampling_logprobs=ep.logprobs,
            finish_reason=ep.finish or "length",
            completion_mask=tuple(ep.mask),
            policy_version=ep.policy_version,
            episode=record,
        )


def episode_metrics(completions: Sequence[Completion], prefix: str = "episode") -> dict[str, float]:
    """Per-episode means (turns, tool calls, tool errors, return, observation and policy tokens),
    the share of episodes that called a tool, and the share truncated, by cause."""
    records = [c.episode for c in completions if c.episode is not None]
    if not records:
        return {}

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in records]))

    metrics = {
        f"{prefix}/turns_mean": mean("assistant_turns"),
        f"{prefix}/tool_calls_mean": mean("tool_calls"),
        f"{prefix}/tool_errors_mean": mean("tool_errors"),
        f"{prefix}/tool_call_rate": float(np.mean([r["tool_calls"] > 0 for r in records])),
        f"{prefix}/return_mean": mean("return"),
        f"{prefix}/observation_tokens_mean": mean("observation_tokens"),
        f"{prefix}/policy_tokens_mean": float(np.mean([c.policy_length for c in completions if c.episode is not None])),
        f"{prefix}/truncated_share": float(np.mean([r["end"] != "done" for r in records])),
        # Episodes whose turns were sampled by more than one weights version (a sync between turns:
        # asynchronous training only).
        f"{prefix}/mixed_versions_share": float(np.mean([len(set(r.get("policy_versions", ()))) > 1 for r in records])),
    }
    for cause in ("max_turns", "max_tokens", "max_episode_tokens", "max_model_len"):
        metrics[f"{prefix}/truncated_{cause}_share"] = float(np.mean([r["end"] == cause for r in records]))
    return metrics
