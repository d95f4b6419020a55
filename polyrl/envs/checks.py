"""``polyrl envs check``: play an environment with scripted assistant turns and check its contract.

Checks, each ``pass``/``warn``/``fail`` with a message:
- ``start``: ``start(row)`` returns ``{role, content}`` messages ending with the turn the policy answers;
- ``tools``: each tool's JSON schema serialises, and its name is unique;
- ``step``: every ``step(text)`` returns a :class:`~polyrl.envs.Step`, a finite reward or None,
  and messages when the episode goes on;
- ``episodes end``: some scripted episode ends with ``done`` within the turns given (warn if none);
- ``fresh instances``: two instances started from the same row give the same first messages.
An exception in the environment is a failure naming the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from polyrl.core.user_code import error_reason, where_it_failed
from polyrl.envs.base import EnvConfigError, EpisodeRow, Step, checked_messages

PASS, WARN, FAIL = "pass", "warn", "fail"

__all__ = ["FAIL", "PASS", "WARN", "CheckResult", "check_env"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    message: str


def _failure(error: BaseException, source: str | None) -> str:
    return f"{where_it_failed(error, source)}: {error_reason(error)}"


def check_env(make_env: Callable[[], Any], rows: Sequence[EpisodeRow], turns: Sequence[str], *,
              source: str | None = None) -> tuple[list[CheckResult], list[dict[str, Any]]]:  # fmt: skip
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
    starts, steps, ended = [], [], 0
    for index, row in enumerate(rows):
        env = make_env()
        try:
            first = checked_messages(env.start(row), where=f"row {index}: start(row)", last_user=True)
            again = checked_messages(make_env().start(row), where=f"row {index}: start(row)", last_user=True)
        except EnvConfigError as error:
            starts.append(str(error))
            continue
        except Exception as error:  # noqa: BLE001 - the author's bug, reported with its line
            starts.append(f"row {index}: start(row) raised at {_failure(error, source)}")
            continue
        if first != again:
            results.append(CheckResult("fresh instances", WARN, f"row {index}: two instances start differently"))
        record: dict[str, Any] = {"row": index, "messages": first, "turns": [], "return": 0.0, "done": False}
        for turn_index, text in enumerate(turns):
            where = f"row {index}, turn {turn_index}"
            try:
                step = env.step(text)
            except Exception as error:  # noqa: BLE001
                steps.append(f"{where}: step(text) raised at {_failure(error, source)}")
                break
            if not isinstance(step, Step):
                steps.append(f"{where}: step(text) must return polyrl.envs.Step, got {type(step).__name__}")
                break
            if step.reward is not None and (not isinstance(step.reward, (int, float)) or not math.isfinite(step.reward)):
                steps.append(f"{where}: reward {step.reward!r} is not a finite number or None")
                break
            try:
                observation = checked_messages(step.observation, where=f"{where}: observation")
            except EnvConfigError as error:
                steps.append(str(error))
                break
            if not step.done and not observation:
                steps.append(f"{where}: the episode goes on (done=False) with no observation")
                break
            record["turns"].append({"assistant": text, "observation": observation, "reward": step.reward,
                                    "tool_calls": step.tool_calls, "tool_errors": step.tool_errors})  # fmt: skip
            record["return"] += float(step.reward or 0.0)
            if step.done:
                record["done"] = True
                ended += 1
                break
        transcripts.append(record)
    results.append(CheckResult("start", FAIL if starts else PASS, "; ".join(starts[:3]) or f"{len(rows)} row(s) started"))
    results.append(
        CheckResult("step", FAIL if steps else PASS, "; ".join(steps[:3]) or f"{len(turns)} scripted turn(s) answered")
    )
    results.append(
        CheckResult(
            "episodes end", PASS if ended else WARN, f"{ended} of {len(transcripts)} episode(s) done within {len(turns)} turn(s)"
        )
    )
    return results, transcripts
