"""``env:``: train on multi-turn episodes with an environment instead of single completions.

With ``env:`` set, every sample of ``rollout.samples_per_prompt`` is an episode
(polyrl/rollout/episodes.py): the environment ``env.module`` starts it from the data row and
answers each assistant turn. ``rollout.max_tokens`` is the budget of ONE assistant turn; the
episode's own budgets are below. The reward is the episode's return (the sum of the
environment's per-turn rewards), logged as the reward labelled ``env``; ``rewards:`` is not used
and is refused when set. See docs/episodes.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from polyrl.config.base import StrictModel


class ToolSandboxConfig(StrictModel):
    """Where tool calls run and their limits besides ``env.tool_timeout_s`` (wall time) and
    ``env.tool_output_chars`` (output), which hold in both modes (docs/episodes.md, "Tools in a sandbox")."""

    mode: Literal["process", "thread"] = Field(
        "process", description="process: each call in a child of a warm worker process, under the CPU, memory, "
        "wall-time and output limits, with no process creation and no inherited environment variables; the "
        "tool's function must be importable (module:function). thread: a daemon thread of the trainer, under "
        "the wall-time limit only (a timed-out call runs on; a crash or os._exit ends the run)."
    )  # fmt: skip
    cpu_seconds: int | None = Field(
        None, ge=1, description="CPU seconds a call may use (RLIMIT_CPU, whole seconds); unset: env.tool_timeout_s "
        "rounded up. Process mode only."
    )  # fmt: skip
    memory_mb: int = Field(
        1024, ge=16, description="Megabytes of address space a call may add to the worker's own (RLIMIT_AS); past "
        "it an allocation fails with MemoryError. Process mode only."
    )  # fmt: skip

    @model_validator(mode="after")
    def _limits_need_a_process(self) -> "ToolSandboxConfig":
        """A thread cannot be held to a CPU or memory limit: setting one with mode: thread is refused."""
        if self.mode == "thread":
            set_limits = sorted({"cpu_seconds", "memory_mb"} & self.model_fields_set)
            if set_limits:
                raise ValueError(
                    f"{', '.join(set_limits)} cannot be enforced with mode: thread (a thread of the trainer has no "
                    "limits but the wall time); allowed: mode: process, or remove them"
                )
        return self

    def settings(self) -> Any:
        """The :class:`polyrl.envs.sandbox.SandboxSettings` the episode runner hands the environment."""
        from polyrl.envs.sandbox import SandboxSettings

        return SandboxSettings(self.mode, self.cpu_seconds, self.memory_mb)


class EnvConfig(StrictModel):
    """The environment of multi-turn episodes: which one, its constructor's params, the episode's budgets and
    how tools are offered (docs/episodes.md)."""

    module: str = Field(
        ..., description="The environment: a registered name (calculator, guess_number), 'file.py:Class', "
        "'package.module:Class' or an entry point of group polyrl.envs."
    )  # fmt: skip
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's constructor.")
    max_turns: int = Field(4, ge=1, description="Assistant turns per episode; an episode not done by then is truncated.")
    max_episode_tokens: int = Field(
        512, ge=1, description="Tokens per episode after its first prompt (the policy's and the observations'); "
        "the policy's last turn is cut to it and an observation that does not fit ends the episode, truncated."
    )  # fmt: skip
    tool_timeout_s: float = Field(5.0, gt=0, description="Time limit of one tool call; past it the call's result is an error.")
    tool_output_chars: int = Field(2000, ge=1, description="A tool result longer than this is cut, with a note saying so.")
    tool_sandbox: ToolSandboxConfig = Field(
        default_factory=ToolSandboxConfig, description="Where tool calls run (process or thread) and their CPU "
        "and memory limits (docs/episodes.md, 'Tools in a sandbox')."
    )  # fmt: skip
    stop: list[str] = Field(
        default_factory=list, description="Strings that also end an assistant turn (e.g. '</tool_call>'), besides the "
        "end-of-turn token; the turn keeps its tokens up to the one completing the string, and the template's "
        "closing of the turn is appended as observation tokens."
    )  # fmt: skip
    tool_format: Literal["auto", "template", "text"] = Field(
        "auto", description="How tools are offered: the chat template's tools= where it renders them in a call "
        "format polyrl parses (auto, template), else (auto, text) the plain-text protocol in a system message."
    )  # fmt: skip
    tool_parser: Literal["auto", "hermes", "llama3_json"] = Field(
        "auto", description="How the policy's tool calls are read: hermes (<tool_call>{...}</tool_call>), llama3_json "
        "(the turn is a bare JSON call {\"name\": ..., \"parameters\": ...}), or auto: the format the rendered prompt "
        "asks for (the chat template's text; hermes for the plain-text protocol). The run says which in its first lines."
    )  # fmt: skip
    step_timeout_s: float = Field(
        60.0, gt=0, description="Time budget of one call of the environment's start(row) or step(text); past it the "
        "run stops with an error naming the environment (a Python call cannot be interrupted)."
    )  # fmt: skip

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, stops: list[str]) -> list[str]:
        if any(stop == "" for stop in stops):
            raise ValueError("an empty stop string would end every turn after its first token; remove it")
        return stops

    @model_validator(mode="after")
    def _step_budget_holds_a_tool_call(self) -> "EnvConfig":
        if self.step_timeout_s < self.tool_timeout_s:
            raise ValueError(
                f"env.step_timeout_s ({self.step_timeout_s:g}) is below env.tool_timeout_s ({self.tool_timeout_s:g}): a step "
                "whose tool call runs out of time would stop the run instead of telling the policy; allowed: "
                "step_timeout_s >= tool_timeout_s"
            )
        return self

    @model_validator(mode="after")
    def _loads(self) -> "EnvConfig":
        """The reference resolves and the params fit its constructor (relative files: the current folder)."""
        from polyrl.envs import EnvConfigError
        from polyrl.envs.registry import bind_env_params, load_env_class
        from polyrl.envs.sandbox import check_tools_for_sandbox

        try:
            cls = load_env_class(self.module)
            bind_env_params(cls, self.params, ref=self.module)
            check_tools_for_sandbox(getattr(cls, "tools", None), self.tool_sandbox.settings())
        except EnvConfigError as error:
            raise ValueError(str(error)) from None
        return self


def env_refusals(cfg: Any) -> list[tuple[tuple[str, ...], Any, str]]:
    """``(field path, value, message)`` for each setting an experiment with ``env:`` cannot honour."""
    if cfg.env is None:
        return []
    refusals: list[tuple[tuple[str, ...], Any, str]] = []
    if "rewards" in cfg.model_fields_set:
        refusals.append((
            ("rewards",), [r.module for r in cfg.rewards],
            "with env: set, the reward is the episode's return (the environment's per-turn rewards); "
            "rewards: is not used; remove it (score inside the environment instead)",
        ))  # fmt: skip
    if cfg.env.max_episode_tokens < cfg.rollout.max_tokens:
        # Every turn may be cut by the episode's budget before its own: a 1-token budget trains 1-token episodes.
        refusals.append((
            ("env", "max_episode_tokens"), cfg.env.max_episode_tokens,
            f"env.max_episode_tokens ({cfg.env.max_episode_tokens}) is below rollout.max_tokens ({cfg.rollout.max_tokens}), "
            "one assistant turn's budget: the episode budget would cut even its first turn; allowed: at least "
            "rollout.max_tokens (an episode holds one whole turn and the turns after it)",
        ))  # fmt: skip
    estimator = _advantage_estimator(cfg)
    if estimator is not None and "baselines" in estimator.requires:
        # ReMax's baseline is the reward of one greedy completion of the prompt; an episode's
        # return needs a whole greedy episode, which the collector does not play.
        field = ("advantage", "estimator") if cfg.advantage.estimator else ("objective", "name")
        whose = "" if cfg.advantage.estimator else f" (the default of objective {cfg.objective.name!r})"
        refusals.append((
            field, cfg.advantage.estimator or cfg.objective.name,
            f"the {estimator.name!r} advantage estimator{whose} takes a greedy completion's reward as its baseline, "
            "which env: episodes do not have (an episode's return would need a whole greedy episode); with env: "
            "use another estimator (advantage.estimator: grpo, rloo, reinforce_pp, ...) or objective",
        ))  # fmt: skip
    if cfg.advantage.overlong.mode == "soft_punishment":
        # Its length budget is one completion's (rollout.max_tokens); an episode's policy tokens
        # span several turns, so every long episode would be punished as overlong.
        refusals.append((
            ("advantage", "overlong", "mode"), "soft_punishment",
            "with env: the overlong penalty would read an episode's tokens over all its turns against one turn's "
            "budget; allowed with env: off, mask_truncated (truncated episodes leave the loss)",
        ))  # fmt: skip
    return refusals


def _advantage_estimator(cfg: Any) -> Any:
    """The arm's advantage estimator (the objective's default when unset), or None if unknown
    (reported by the objective check)."""
    from polyrl.algos.advantages import get_advantage
    from polyrl.algos.objectives import get_objective

    try:
        return get_advantage(cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage)
    except Exception:  # noqa: BLE001 - an unknown name is refused, with its allowed values, elsewhere
        return None
