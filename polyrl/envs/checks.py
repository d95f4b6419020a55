"""``polyrl envs check``: play an environment with scripted assistant turns and check its contract.

Checks, each ``pass``/``warn``/``fail`` with a message:
- ``start``: ``start(row)`` returns ``{role, content}`` messages ending with the turn the policy answers;
- ``tools``: each tool's JSON schema serialises, and its name is unique;
- ``step``: every ``step(text)`` returns a :class:`~polyrl.envs.Step`, a reward a run accepts
  (None, or a finite real number within the float32 range: :func:`~polyrl.envs.base.checked_reward`),
  and messages when the episode goes on;
- ``episodes end``: some scripted episode ends with ``done`` within the turns given (warn if none);
- ``fresh instances``: two instances started from the same row give the same first messages.
Each ``start`` and ``step`` call runs on the run's time budget (``timeout_s``, a run's
``env.step_timeout_s``; :mod:`polyrl.envs.calls`). An exception, a ``sys.exit`` or a time-out is
a failure naming the row, the turn, the file and the line; after a time-out the check stops
(the stuck call cannot be stopped, so playing on beside it would share its state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from polyrl.envs.base import EnvConfigError, EnvFailedError, EpisodeRow, Step, checked_messages, checked_reward
from polyrl.envs.calls import DEFAULT_STEP_TIMEOUT_S, EnvStuckError, call_env, row_words

PASS, WARN, FAIL = "pass", "warn", "fail"

__all__ = ["FAIL", "PASS", "WARN", "CheckResult", "check_env"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    message: str


def check_env(make_env: Callable[[], Any], rows: Sequence[EpisodeRow], turns: Sequence[str], *, source: str | None = None,
              timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S, name: str = "env") -> tuple[list[CheckResult], list[dict[str, Any]]]:  # fmt: skip
    """The checks' results and a transcript per row (the scripted turns, the answers, the rewards)."""
    results: list[CheckResult] = []
    transcripts: list[dict[str, Any]] = []
    try:
        probe = make_env()
    except EnvConfigError as error:
        return [CheckResult("construct", FAIL, str(error))], []
    tools = list(getattr(probe, "tools", []) or [])
    try:
        names = [t.name for t in tools]
        json.dumps([t.schema() for t in tools])
        if len(set(names)) != len(names):
            results.append(CheckResult("tools", FAIL, f"tool names repeat: {names}"))
        else:
            results.append(CheckResult("tools", PASS, f"{len(tools)} tool(s): {', '.join(names) or '(none)'}"))
    except (AttributeError, TypeError, ValueError) as error:
        results.append(CheckResult("tools", FAIL, f"tools must be polyrl.envs.Tool objects with JSON schemas: {error}"))

    def call(function: Callable[..., Any], argument: Any, method: str, where: str) -> Any:
        return call_env(function, argument, env_name=name, method=method, where=where, timeout_s=timeout_s, source=source,
                        budget_field="--timeout (a run's env.step_timeout_s)")  # fmt: skip

    starts, steps, ended, stuck = [], [], 0, False
    for index, row in enumerate(rows):
        words = row_words(row.prompt, row.fields, index)
        env = make_env()
        try:
            first = checked_messages(call(env.start, row, "start(row)", words), where=f"row {index}: start(row)", last_user=True)
            again = checked_messages(call(make_env().start, row, "start(row)", words), where=f"row {index}: start(row)",
                                     last_user=True)  # fmt: skip
        except (EnvConfigError, EnvFailedError) as error:
            starts.append(str(error))
            stuck = isinstance(error, EnvStuckError)
            if stuck:
                break
            continue
        if first != again:
            results.append(CheckResult("fresh instances", WARN, f"row {index}: two instances start differently"))
        record: dict[str, Any] = {"row": index, "messages": first, "turns": [], "return": 0.0, "done": False}
        for turn_index, text in enumerate(turns):
            where = f"row {index}, turn {turn_index}"
            try:
                step = call(env.step, text, "step(text)", f"turn {turn_index} of {words}")
            except EnvFailedError as error:
                steps.append(str(error))
                stuck = isinstance(error, EnvStuckError)
                break
            if not isinstance(step, Step):
                steps.append(f"{where}: step(text) must return polyrl.envs.Step, got {type(step).__name__}")
                break
            try:
                reward = checked_reward(step.reward, where=f"{where}: step(text)")
                observation = checked_messages(step.observation, where=f"{where}: observation")
            except (EnvConfigError, EnvFailedError) as error:
                steps.append(str(error))
                break
            if not step.done and not observation:
                steps.append(f"{where}: the episode goes on (done=False) with no observation")
                break
            record["turns"].append({"assistant": text, "observation": observation, "reward": reward,
                                    "tool_calls": step.tool_calls, "tool_errors": step.tool_errors})  # fmt: skip
            record["return"] += reward or 0.0
            if step.done:
                record["done"] = True
                ended += 1
                break
        transcripts.append(record)
        if stuck:
            break
    results.append(CheckResult("start", FAIL if starts else PASS, "; ".join(starts[:3]) or f"{len(rows)} row(s) started"))
    results.append(
        CheckResult("step", FAIL if steps else PASS, "; ".join(steps[:3]) or f"{len(turns)} scripted turn(s) answered")
    )
    if stuck:
        return results, transcripts  # the rest was not played
    results.append(
        CheckResult(
            "episodes end", PASS if ended else WARN, f"{ended} of {len(transcripts)} episode(s) done within {len(turns)} turn(s)"
        )
    )
    return results, transcripts
