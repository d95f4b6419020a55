"""The episode rollout: multi-turn episodes with an environment, token in and token out.

One episode per (prompt, sample): the environment starts it from the data row (its first
messages, rendered through the tokenizer's chat template with the generation prompt); then,
turn after turn, the policy answers and the environment replies (:mod:`polyrl.envs`).

Token in, token out. The policy's tokens are kept exactly as the engine sampled them, with their
sampling log-probs; nothing the policy generated is ever re-tokenised from text. An observation
(tool result, user message, feedback) is rendered through the chat template as the DIFFERENCE
between the templated conversation with and without it, and only that difference is encoded
and appended. The template's own closing of the assistant turn that the policy did not sample
(e.g. the ``\\n`` after ``<|im_end|>`` in ChatML) is part of that difference. Every appended
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.envs import EnvConfigError, EpisodeRow, Step, checked_messages, tool_protocol_text

__all__ = ["ChatRenderer", "EpisodeRunner", "EpisodeSettings", "episode_metrics"]


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 4
    max_episode_tokens: int = 512
    tool_timeout_s: float = 5.0
    tool_output_chars: int = 2000
    tool_format: Literal["auto", "template", "text"] = "auto"
    system_prompt: str | None = None
    env_name: str = "env"  # for error messages
    # Stop strings that also end an assistant turn (e.g. "</tool_call>"), besides end of turn/EOS.
    stop: tuple[str, ...] = ()


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` list (it reads ``tools``)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and "tools" in template


class ChatRenderer:
    """The chat template's text of a conversation, with the tools offered its way (``tools=``) or
    in the plain-text protocol of :mod:`polyrl.envs.tools` (a system message)."""

    def __init__(self, tokenizer: Any, tools: Sequence[Any], tool_format: str = "auto", system_prompt: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise EnvConfigError("env: episodes are rendered through a chat template, but the policy's tokenizer has none")
        self.tokenizer = tokenizer
        self.tools = list(tools)
        takes_tools = template_takes_tools(tokenizer)
        if tool_format == "template" and self.tools and not takes_tools:
            raise EnvConfigError(
                "env.tool_format: template, but the policy's chat template does not render tools=; allowed: auto, text"
            )
        self.template_tools = bool(self.tools) and takes_tools and tool_format != "text"
        system = [system_prompt] if system_prompt else []
        if self.tools and not self.template_tools:
            system.append(tool_protocol_text(self.tools))
        self.system_text = "\n\n".join(system) or None
        self.tool_role = "tool"

    def first_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.system_text is None:
            return messages
        if messages[0]["role"] == "system":
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + self.system_text}, *messages[1:]]
        return [{"role": "system", "content": self.system_text}, *messages]

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        kwargs = {"tools": [t.schema() for t in self.tools]} if self.template_tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        # The template is the one authority on special tokens (as polyrl/data/chat.py).
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def observation_messages(self, observation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool results as the template takes them: role ``tool``, or a user message for a template
        that refuses that role (decided once, at the first tool result)."""
        if self.tool_role == "tool":
            return observation
        return [
            {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"} if m["role"] == "tool" else m
            for m in observation
        ]

    def observation_ids(
        self, history: list[dict[str, Any]], assistant_text: str, sampled_ids: list[int], observation: list[dict[str, Any]]
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """The ids to append after the policy's sampled turn: the template's closing of that turn
        (what it writes after the policy's last token) and the observation messages, rendered as
        the difference of the templated conversation with and without them. Returns the ids and
        the history with the assistant turn and the observation."""
        before = self.render(history, generation_prompt=True)
        with_turn = [*history, {"role": "assistant", "content": assistant_text}]
        closed = self.render(with_turn, generation_prompt=False)
        turn = closed[len(before) :] if closed.startswith(before) else closed
        sampled = self.tokenizer.decode(sampled_ids, skip_special_tokens=False)
        if turn.startswith(sampled):
            tail = turn[len(sampled) :]
        else:
            # The template rewrote the turn (stripped spaces, say): its closing after the content,
            # less the stop token the policy already sampled.
            at = turn.rfind(assistant_text)
            tail = turn[at + len(assistant_text) :] if at >= 0 else ""
            extra = sampled[len(assistant_text) :] if sampled.startswith(assistant_text) else ""
            if extra and tail.startswith(extra):
                tail = tail[len(extra) :]
        messages = self.observation_messages(observation)
        try:
            after = self.render([*with_turn, *messages], generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template without a tool role raises its own error type
            if self.tool_role != "tool" or not any(m["role"] == "tool" for m in observation):
                raise
            self.tool_role = "user"
            messages = self.observation_messages(observation)
            after = self.render([*with_turn, *messages], generation_prompt=True)
        if not after.startswith(closed):
            raise EnvConfigError(
                "env: the chat template renders the conversation differently once a message is added "
                f"(not a prefix: {closed[-80:]!r} vs {after[len(closed) - 80 : len(closed)]!r}); "
                "the observation tokens cannot be appended without re-tokenising the policy's turn"
            )
        return self.encode(tail + after[len(closed) :]), [*with_turn, *messages]


@dataclass
class _Episode:
    env: Any
    group: int
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
        self.renderer = ChatRenderer(tokenizer, getattr(probe, "tools", []) or [], settings.tool_format, settings.system_prompt)

    def _new_episode(self, prompt: PromptSample, group: int) -> _Episode:
        s = self.settings
        env = self.make_env()
        if hasattr(env, "tool_timeout_s"):
            env.tool_timeout_s, env.tool_output_chars = s.tool_timeout_s, s.tool_output_chars
        row = EpisodeRow(prompt.prompt, list(prompt.references), dict(prompt.fields))
        messages = checked_messages(env.start(row), where=f"{s.env_name}.start(row)", last_user=True)
        messages = self.renderer.first_messages(messages)
        text = self.renderer.render(messages, generation_prompt=True)
        episode = _Episode(env, group, messages, text, self.renderer.encode(text))
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
        step = self._step(ep, text)
        record.update(reward=step.reward, tool_calls=step.tool_calls, tool_errors=step.tool_errors)
        ep.rewards.append(step.reward)
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
        observation = checked_messages(step.observation, where=f"{s.env_name}.step(text).observation")
        if not observation:
            raise EnvConfigError(f"{s.env_name}.step(text): the episode goes on (done=False) but the observation is empty")
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

    def _step(self, ep: _Episode, text: str) -> Step:
        step = ep.env.step(text)
        if not isinstance(step, Step):
            raise EnvConfigError(f"{self.settings.env_name}.step(text) must return a polyrl.envs.Step, got {type(step).__name__}")
        return step

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
