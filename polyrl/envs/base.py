"""The environment protocol: a data row starts an episode; each assistant turn gets an answer.

An environment is a small class, like a reward module. One instance plays one episode:

- ``start(row) -> list[message]``: the conversation the policy first sees (``{role, content}``
  messages ending with the turn the policy answers, usually a user message). ``row`` is the
  dataset row: its prompt text and every other column.
- ``step(text) -> Step``: the policy's assistant turn (its text, stop token removed) in; out: the
  observation (zero or more messages: a tool result, a user message, feedback), a reward for
  this turn or ``None``, and whether the episode is over.
- ``tools`` (optional): :class:`~polyrl.envs.tools.Tool` objects the policy may call. An
  environment with tools usually derives from :class:`ToolEnvironment`, which answers tool
  calls itself and hands every other turn to ``answer(text)``.

Parameters come from the experiment YAML (``env.params``) as constructor keyword arguments. The
episode's return is the sum of its turns' rewards (``None`` counts 0).

Accuracy (``train/accuracy``, the eval harness's ``accuracy`` and pass@k) counts an episode solved
when the environment's last verdict (``Step.solved``) says so; an episode with no verdict falls
back to "return above 0". Give verdicts on every turn whenever the return can be positive without
a solved task, e.g. a format reward for a tool call: an episode cut at ``max_turns`` after a
call then ends unsolved rather than counted by its format reward.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from polyrl.core.errors import PolyrlError
from polyrl.envs.errors import EnvConfigError

# The float32 range rewards are trained in, as polyrl.rewards.summary.SCORE_LIMIT (not imported
# from there: polyrl.rewards loads every built-in reward module, seconds of imports).
SCORE_LIMIT = float(np.finfo(np.float32).max)

__all__ = [
    "EnvConfigError",
    "EnvFailedError",
    "Environment",
    "EpisodeRow",
    "Step",
    "ToolEnvironment",
    "checked_messages",
    "checked_reward",
    "episode_accuracy_value",
]


class EnvFailedError(PolyrlError, RuntimeError):
    """An environment's own code failed while playing: ``start`` or ``step`` raised, called
    ``sys.exit``, ran past its time budget (``env.step_timeout_s``) or returned a reward that
    cannot be trained on. The message names the environment, the method, the row and the turn,
    as a reward module's failure names the module and the sample."""


class MissingColumnError(KeyError):
    """A column an environment reads is not in the row (a ``KeyError``, so ``row.get`` and
    ``except KeyError`` work as with a dict); its message names the columns there are."""

    def __init__(self, key: str, columns: list[str]):
        super().__init__(key)
        self.key, self.columns = key, columns

    def __str__(self) -> str:
        return f"the row has no {self.key!r} column; its columns: {', '.join(self.columns)}"


@dataclass
class EpisodeRow:
    """The data row an episode starts from: the prompt text, references and every other column."""

    prompt: str
    references: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        """``row["a"]``: a column (``prompt`` included), as a dict row reads; a missing one raises
        :class:`MissingColumnError` (a ``KeyError``) naming the columns the row has."""
        if key == "prompt":
            return self.prompt
        try:
            return self.fields[key]
        except KeyError:
            raise MissingColumnError(key, ["prompt", *self.fields]) from None

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


@dataclass
class Step:
    """The environment's answer to one assistant turn."""

    observation: list[dict[str, Any]] = field(default_factory=list)  # messages appended after the turn
    reward: float | None = None
    done: bool = False
    tool_calls: int = 0  # tool calls this turn made (metrics)
    tool_errors: int = 0  # of which failed: exception, time-out, malformed call, unknown tool
    # Whether the task is solved as of this turn (None: no verdict). An episode's verdict is the
    # last one given, so say False on the turns before the deciding one: an episode cut at
    # max_turns then ends unsolved. What accuracy counts; an episode with no verdict at all counts
    # as solved when its return is above 0.
    solved: bool | None = None


def episode_accuracy_value(record: dict[str, Any]) -> float | None:
    """An episode's value for :func:`polyrl.rewards.summary.accuracy_share` (solved: above 0):
    1 or 0 when the environment said whether it solved the task (``Step.solved``), else its
    return, so a shaped return (a format reward for a call that ran) is never read as a solve."""
    solved = record.get("solved")
    if solved is None:
        return record["return"]
    return 1.0 if solved else 0.0


@runtime_checkable
class Environment(Protocol):
    """What the episode rollout calls (see the module docstring)."""

    def start(self, row: EpisodeRow) -> list[dict[str, Any]]: ...

    def step(self, text: str) -> Step: ...


def checked_reward(value: Any, *, where: str) -> float | None:
    """``Step.reward`` as a float (or None), held to the rule reward modules' scores are held to
    (:func:`polyrl.rewards.composite.validate_scores`): a real number (a numpy scalar or a 0-d
    numpy array or torch tensor included; ``bool`` and strings refused), finite and within the
    float32 range rewards are trained in; else :class:`EnvFailedError` naming ``where``."""
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a 0-d numpy array or torch tensor
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EnvFailedError(f"{where} returned reward {value!r:.80} ({type(value).__name__}); expected a float or None")
    number = float(value)
    if not math.isfinite(number):
        raise EnvFailedError(f"{where} returned reward {number}; rewards must be finite numbers or None")
    if abs(number) > SCORE_LIMIT:
        raise EnvFailedError(
            f"{where} returned reward {number:g}: beyond the float32 range (|reward| <= {SCORE_LIMIT:.4g}) rewards "
            "are trained in; rescale it"
        )
    return number


def checked_messages(messages: Any, *, where: str, last_user: bool = False) -> list[dict[str, Any]]:
    """``messages`` as a list of ``{role: str, content: str, ...}`` dicts, or :class:`EnvConfigError`
    naming ``where`` (the environment method that returned them)."""
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, (list, tuple)):
        raise EnvConfigError(f"{where} must return a list of {{role, content}} messages, got {type(messages).__name__}")
    out = []
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise EnvConfigError(f"{where}[{index}] must be a {{role: str, content: str}} dict, got {message!r:.200}")
        out.append(dict(message))
    if last_user and (not out or out[-1]["role"] == "assistant"):
        raise EnvConfigError(f"{where} must end with the turn the policy answers (a user message), got {out[-1:]!r:.200}")
    return out


class ToolEnvironment:
    """Base class of an environment with tools: a turn holding tool calls gets their results (one
    ``tool`` message each) and the episode goes on; any other turn is the final answer, scored by
    :meth:`answer`. Subclasses set ``tools`` and implement :meth:`start` and :meth:`answer`."""

    tools: ClassVar[list[Any]] = []
    # Filled by the episode rollout from env.tool_timeout_s / env.tool_output_chars, and with the
    # call format the policy was asked for (env.tool_parser, resolved: hermes or llama3_json).
    tool_timeout_s: float = 5.0
    tool_output_chars: int = 2000
    # Where calls run (env.tool_sandbox; polyrl.envs.sandbox.SandboxSettings). None: the default,
    # a worker process with the default limits.
    tool_sandbox: Any = None
    tool_parser: str = "hermes"

    def start(self, row: EpisodeRow) -> list[dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def answer(self, text: str) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self, text: str) -> Step:
        from polyrl.envs.tools import parse_tool_calls, run_tool_call

        calls = parse_tool_calls(text, self.tool_parser)
        if not calls:
            return Step(reward=float(self.answer(text)), done=True)
        results = [run_tool_call(call, self.tools, timeout_s=self.tool_timeout_s, output_chars=self.tool_output_chars,
                                 sandbox=self.tool_sandbox) for call in calls]  # fmt: skip
        return Step(
            observation=[{"role": "tool", "name": r.name, "content": r.content} for r in results],
            tool_calls=len(results),
            tool_errors=sum(not r.ok for r in results),
        )
