"""Tools: Python functions with a JSON schema, the calls a policy writes, and running them safely.

Calls are read back from the policy's text by a named parser (``env.tool_parser``; the names
are vLLM's ``--tool-call-parser`` names for the same formats):

- ``hermes``: a JSON object between tags, the format Hermes-style and Qwen2.5 chat templates ask
  for; a turn may hold several::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>

- ``llama3_json``: the turn is the call, a bare JSON object with ``parameters`` (or
  ``arguments``), the format Llama 3.1/3.2 templates ask for; optionally after ``<|python_tag|>``,
  several separated by ``;``::

    {"name": "calculator", "parameters": {"expression": "123 * 45"}}

The plain-text protocol (used where the chat template has no tool format of its own) tells the
policy, in a system message, to write calls in the parser's format (:func:`tool_protocol_text`).

Every call runs under a time limit and an output cap. A call that raises, runs out of time, is
not valid JSON, names no tool or an unknown one, or passes arguments the function does not take,
becomes a result with ``ok=False`` whose text tells the policy what went wrong: an observation,
never a crashed run. Calls run in a worker process under CPU, memory, wall-time and output
limits (:mod:`polyrl.envs.sandbox`, ``env.tool_sandbox``); with ``mode: thread`` in a daemon
thread of the trainer instead, where a timed-out call runs on (Python cannot stop a thread) and
its result is thrown away.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.envs.errors import EnvConfigError
from polyrl.envs.sandbox import SandboxSettings, is_sandbox_only, run_in_sandbox, thread_refusal

__all__ = [
    "TOOL_CALL_PATTERN",
    "TOOL_PARSERS",
    "Tool",
    "ToolCall",
    "ToolResult",
    "parse_tool_calls",
    "run_tool_call",
    "tool",
    "tool_protocol_text",
]

TOOL_CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# The named call formats (env.tool_parser, besides auto); see the module docstring.
TOOL_PARSERS = ("hermes", "llama3_json")
LLAMA3_CALL_TAG = "<|python_tag|>"
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    """A function the policy may call, with its JSON schema (OpenAI function format)."""

    name: str
    function: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` dict chat templates take as ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def tool(function: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Make a :class:`Tool` of a function: its name, its docstring's first paragraph and a JSON
    schema of its annotated parameters (``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``).
    Use as ``@tool`` or ``@tool(name=..., description=...)``."""

    def make(fn: Callable[..., Any]) -> Tool:
        properties, required = {}, []
        for param in inspect.signature(fn).parameters.values():
            json_type = _JSON_TYPES.get(
                param.annotation if not isinstance(param.annotation, str) else eval_annotation(param.annotation)
            )
            properties[param.name] = {"type": json_type} if json_type else {}
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        doc = (description if description is not None else inspect.getdoc(fn) or "").split("\n\n")[0].strip()
        return Tool(name or fn.__name__, fn, doc, {"type": "object", "properties": properties, "required": required})

    return make(function) if function is not None else make


def eval_annotation(text: str) -> type | None:
    """A string annotation (``from __future__ import annotations``) of a plain type, else None."""
    return {t.__name__: t for t in _JSON_TYPES}.get(text)


def tool_protocol_text(tools: list[Tool], parser: str = "hermes") -> str:
    """The plain-text protocol, told to the policy in the system message where the chat template
    takes no ``tools=``: calls written in ``parser``'s format."""
    if parser == "llama3_json":
        lines = [
            "You can call tools. To call one, answer with nothing but a JSON object, e.g.",
            '{"name": "<tool name>", "parameters": {<arguments>}}',
            "and stop; the result comes back in the next message. Any other answer is your final answer. Available tools:",
        ]
    else:
        lines = [
            "You can call tools. To call one, write a JSON object between <tool_call> and </tool_call>, e.g.",
            '<tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>',
            "and stop; the result comes back in the next message. Available tools:",
        ]
    lines += [json.dumps(t.schema()["function"], sort_keys=True) for t in tools]
    return "\n".join(lines)


@dataclass(frozen=True)
class ToolCall:
    name: str | None
    arguments: dict[str, Any]
    error: str | None = None  # a malformed call: what is wrong with it


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    ok: bool
    # "exception", "timeout", "malformed", "unknown_tool", "bad_arguments"; in a sandbox process also
    # "cpu_limit", "memory_limit", "output_limit" (printed too much) and "crash" (a signal, os._exit)
    error_kind: str | None = None


def parse_tool_calls(text: str, parser: str = "hermes") -> list[ToolCall]:
    """The calls in an assistant turn, read by ``parser`` (:data:`TOOL_PARSERS`); a malformed one
    is kept, with its error. No call: the turn is the final answer."""
    if parser == "hermes":
        return [_hermes_call(body) for body in TOOL_CALL_PATTERN.findall(text)]
    if parser == "llama3_json":
        return _llama3_json_calls(text)
    raise ValueError(f"unknown tool parser {parser!r}; allowed: {', '.join(TOOL_PARSERS)}")


def _hermes_call(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        return ToolCall(None, {}, f"the tool call is not valid JSON ({error.msg} at character {error.pos})")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(None, {}, 'a tool call must be a JSON object with a "name" string')
    return _with_arguments(value["name"], value.get("arguments", {}), "arguments")


def _with_arguments(name: str, arguments: Any, key: str) -> ToolCall:
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, f'"{key}" must be a JSON object')
    return ToolCall(name, arguments)


def _llama3_json_calls(text: str) -> list[ToolCall]:
    """A turn that is a call (or several, ``;``-separated): it starts, once blanks and
    ``<|python_tag|>`` are set aside, with a JSON object naming a tool. A turn that starts with
    ``{`` and mentions ``"name"`` but is not valid JSON is a malformed call (the policy is told);
    any other turn, a JSON object without ``"name"`` included, is the final answer."""
    rest = text.strip()
    if rest.startswith(LLAMA3_CALL_TAG):
        rest = rest[len(LLAMA3_CALL_TAG) :].lstrip()
    if not rest.startswith("{"):
        return []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(rest) and rest[at] == "{":
        try:
            value, end = decoder.raw_decode(rest, at)
        except json.JSONDecodeError as error:
            if calls or '"name"' in rest[at:]:
                calls.append(ToolCall(None, {}, f"the tool call is not valid JSON ({error.msg} at character {error.pos})"))
            break
        if not isinstance(value, dict) or "name" not in value:
            break  # JSON, but not a call: an answer written as JSON
        if not isinstance(value["name"], str):
            calls.append(ToolCall(None, {}, 'a tool call must be a JSON object with a "name" string'))
        else:
            key = "parameters" if "parameters" in value else "arguments"
            calls.append(_with_arguments(value["name"], value.get(key, {}), key))
        at = end
        while at < len(rest) and rest[at] in " \t\r\n;":
            at += 1
    return calls


def _capped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output truncated: {len(text)} characters, {limit} shown]"


def run_tool_call(
    call: ToolCall, tools: list[Tool], *, timeout_s: float, output_chars: int, sandbox: SandboxSettings | None = None
) -> ToolResult:
    """Run ``call`` against ``tools`` (see the module docstring); never raises for the tool's sake.
    ``sandbox`` (default: a worker process with the default limits, :mod:`polyrl.envs.sandbox`)
    says where the call runs; a tool the sandbox cannot run (its function not importable by
    reference, its module failing to import, a sandbox-only tool in thread mode) raises
    :class:`~polyrl.envs.base.EnvConfigError`: that is the environment's configuration, not the call."""
    sandbox = sandbox if sandbox is not None else SandboxSettings()
    name = call.name or "?"
    if call.error is not None:
        return ToolResult(name, f"Error: {call.error}", False, "malformed")
    by_name = {t.name: t for t in tools}
    if call.name not in by_name:
        known = ", ".join(sorted(by_name)) or "(none)"
        return ToolResult(name, f"Error: unknown tool {call.name!r}; available tools: {known}", False, "unknown_tool")
    function = by_name[call.name].function
    try:
        inspect.signature(function).bind(**call.arguments)
    except TypeError as error:
        return ToolResult(name, f"Error: bad arguments for {call.name}: {error}", False, "bad_arguments")
    except ValueError:  # no signature to check (a builtin): let the call say
        pass
    if sandbox.mode == "process":
        outcome = run_in_sandbox(call.name, function, call.arguments, timeout_s=timeout_s, output_chars=output_chars,
                                 settings=sandbox)  # fmt: skip
        return ToolResult(name, outcome.content, outcome.ok, outcome.error_kind)
    if is_sandbox_only(function):
        raise EnvConfigError(thread_refusal(call.name))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = function(**call.arguments)
        except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt of a tool included
            box["error"] = error

    worker = threading.Thread(target=target, name=f"polyrl-tool-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return ToolResult(name, f"Error: {call.name} did not finish within {timeout_s:g} s", False, "timeout")
    if "error" in box:
        error = box["error"]
        return ToolResult(name, _capped(f"Error: {type(error).__name__}: {error}", output_chars), False, "exception")
    value = box.get("value")
    try:
        text = value if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return ToolResult(name, _capped(text, output_chars), True)
