"""Environments: multi-turn episodes with tools, beside reward modules (both user plug-ins).

from polyrl.envs import load_env_class, build_env
env = build_env(load_env_class("calculator"), {}, ref="calculator")
messages = env.start(row); step = env.step("<tool_call>...</tool_call>")

See docs/episodes.md. The episode rollout itself (token in, token out) is polyrl/rollout/episodes.py.
"""

from polyrl.envs.base import EnvConfigError, EnvFailedError, Environment, EpisodeRow, Step, ToolEnvironment, checked_messages
from polyrl.envs.registry import ENTRY_POINT_GROUP, build_env, env_entry_points, load_env_class, register_env, registered_envs
from polyrl.envs.tools import (
    TOOL_PARSERS,
    Tool,
    ToolCall,
    ToolResult,
    parse_tool_calls,
    run_tool_call,
    tool,
    tool_protocol_text,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "TOOL_PARSERS",
    "EnvConfigError",
    "EnvFailedError",
    "Environment",
    "EpisodeRow",
    "Step",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "ToolResult",
    "build_env",
    "checked_messages",
    "env_entry_points",
    "load_env_class",
    "parse_tool_calls",
    "register_env",
    "registered_envs",
    "run_tool_call",
    "tool",
    "tool_protocol_text",
]
