"""An episode's conversation through the policy's chat template: how tools are offered, which
call format is parsed back, and the observation tokens appended after each assistant turn.

Tools and calls. The policy must be asked for calls in the format they are parsed in, or a call
written as asked is scored as the final answer. ``env.tool_format`` says how tools are offered
(the template's own ``tools=`` rendering, or the plain-text protocol in a system message);
``env.tool_parser`` says how calls are read back (:data:`polyrl.envs.tools.TOOL_PARSERS`).
With ``auto``, the template's text is read: the probe conversation is rendered with and without
``tools=``; where the tools change it, the added text names the format it asks for (Hermes
``<tool_call>`` tags, or the Llama 3.1/3.2 instruction to answer with a bare JSON object naming
the function and its ``parameters``). A template that renders no tools, or asks for a format
polyrl does not parse, falls back to the plain-text protocol. The choice is one sentence
(:attr:`ChatRenderer.tool_note`) that the run says in its first lines.

The closing of a turn. After the policy's sampled turn the template writes its end-of-turn
text (``<|im_end|>\\n`` in ChatML, ``<|eot_id|>`` in Llama 3, ``<end_of_turn>\\n`` in Gemma).
It is read from a render whose assistant content is a marker, so a template that trims the
content (Llama 3, Gemma) gives the same closing whatever blanks the policy wrote; the part of
it the policy already sampled (its end-of-turn token, when it stopped there rather than at an
``env.stop`` string) is left out, token for token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from polyrl.envs import EnvConfigError, tool_protocol_text

__all__ = ["ChatRenderer", "ToolChoice", "resolve_tool_choice", "template_call_format"]

PROBE = [{"role": "user", "content": "What is 2 + 2?"}]
# Assistant content no template rewrites (no blanks to trim, no tags): where it ends, the closing begins.
TURN_MARKER = "polyrlTurnMarker7f3a"
FORMAT_WORDS = {
    "hermes": "calls in <tool_call> tags (Hermes)",
    "llama3_json": 'bare JSON calls {"name": ..., "parameters": ...} (Llama 3)',
}
# The Llama 3.1/3.2 templates' instruction ("respond with a JSON for a function call ... in the
# format {"name": function name, "parameters": ...}"), in the words any of its versions use.
_LLAMA3_ASKS = re.compile(r'json for a function call|"name":\s*function name', re.IGNORECASE)


def template_call_format(tokenizer: Any, tools: Sequence[Any]) -> tuple[bool, str | None]:
    """Whether the chat template renders ``tools=`` at all (the probe conversation changes with
    them) and, if so, which call format its added text asks for (None: neither it knows)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or not tools:
        return False, None
    try:
        plain = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
        offered = tokenizer.apply_chat_template(
            PROBE, tokenize=False, add_generation_prompt=True, tools=[t.schema() for t in tools]
        )
    except Exception:  # noqa: BLE001 - a template that cannot render tools= takes none
        return False, None
    if offered == plain:
        return False, None
    if "<tool_call>" in offered and "<tool_call>" not in plain:
        return True, "hermes"
    if _LLAMA3_ASKS.search(offered) and not _LLAMA3_ASKS.search(plain):
        return True, "llama3_json"
    return True, None


@dataclass(frozen=True)
class ToolChoice:
    template_tools: bool  # offered through the template's tools=, else the plain-text protocol
    parser: str  # how calls are parsed: hermes or llama3_json
    note: str  # the choice in one sentence, for the run's first lines


def resolve_tool_choice(tokenizer: Any, tools: Sequence[Any], tool_format: str = "auto", tool_parser: str = "auto") -> ToolChoice:
    """How ``tools`` are offered and parsed (see the module docstring); :class:`EnvConfigError`
    naming the field where the settings and the template disagree."""
    renders, asked = template_call_format(tokenizer, tools)
    if tool_format == "template" and not renders:
        raise EnvConfigError(
            "env.tool_format: template, but the policy's chat template does not render tools=; allowed: auto, text"
        )
    if tool_format != "text" and renders and asked is not None and tool_parser not in ("auto", asked):
        raise EnvConfigError(
            f"env.tool_parser: {tool_parser}, but the policy's chat template asks for {FORMAT_WORDS[asked]}: calls "
            f"written as asked would be scored as final answers; allowed: auto, {asked} (or env.tool_format: text, "
            f"which asks for {tool_parser} calls in a system message)"
        )
    template_tools = renders and tool_format != "text" and (asked is not None or tool_parser != "auto")
    if tool_format == "template" and not template_tools:
        raise EnvConfigError(
            "env.tool_format: template, but the policy's chat template asks for a call format polyrl does not "
            "recognise (neither <tool_call> tags nor Llama 3 JSON); set env.tool_parser to the format it asks for "
            "(hermes, llama3_json), or env.tool_format: auto or text for the plain-text protocol"
        )
    if template_tools:
        parser = asked or tool_parser
        why = f"it asks for {FORMAT_WORDS[parser]}" if asked else "its text names neither format; env.tool_parser says"
        note = f"env.tool_parser: tools are offered through the chat template ({why}); calls are parsed as {parser}"
        return ToolChoice(True, parser, note)
    parser = "hermes" if tool_parser == "auto" else tool_parser
    if tool_format == "text":
        why = "env.tool_format: text"
    elif not renders:
        why = "the chat template renders no tools="
    else:
        why = "the chat template asks for a call format polyrl does not recognise"
    note = (
        f"env.tool_parser: tools are offered in the plain-text protocol, a system message ({why}); "
        f"calls are asked for and parsed as {parser}"
    )
    return ToolChoice(False, parser, note)


class ChatRenderer:
    """The chat template's text of a conversation, with the tools offered its way (``tools=``) or
    in the plain-text protocol of :mod:`polyrl.envs.tools` (a system message)."""

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Any],
        tool_format: str = "auto",
        system_prompt: str | None = None,
        tool_parser: str = "auto",
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise EnvConfigError("env: episodes are rendered through a chat template, but the policy's tokenizer has none")
        self.tokenizer = tokenizer
        self.tools = list(tools)
        choice = resolve_tool_choice(tokenizer, self.tools, tool_format, tool_parser) if self.tools else None
        self.template_tools = choice is not None and choice.template_tools
        self.tool_parser = choice.parser if choice is not None else "hermes"
        self.tool_note = choice.note if choice is not None else None  # None: no tools to offer
        system = [system_prompt] if system_prompt else []
        if self.tools and not self.template_tools:
            system.append(tool_protocol_text(self.tools, self.tool_parser))
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

    def unsampled_closing(self, history: list[dict[str, Any]], sampled_ids: list[int]) -> str:
        """The template's closing of an assistant turn after ``history``, less the part the policy
        sampled: the closing's leading tokens that the sampled ids end with (its end-of-turn token,
        when it stopped there)."""
        marked = self.render([*history, {"role": "assistant", "content": TURN_MARKER}], generation_prompt=False)
        at = marked.rfind(TURN_MARKER)
        if at < 0:
            raise EnvConfigError("env: the chat template drops the assistant's content; its turns cannot be closed")
        closing = marked[at + len(TURN_MARKER) :]
        closing_ids = self.encode(closing)
        for k in range(min(len(closing_ids), len(sampled_ids)), 0, -1):
            if sampled_ids[-k:] == closing_ids[:k]:
                sampled = self.tokenizer.decode(closing_ids[:k], skip_special_tokens=False)
                if closing.startswith(sampled):
                    return closing[len(sampled) :]
        return closing

    def observation_ids(
        self, history: list[dict[str, Any]], assistant_text: str, sampled_ids: list[int], observation: list[dict[str, Any]]
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """The ids to append after the policy's sampled turn: the template's closing of that turn
        that the policy did not sample, and the observation messages, rendered as the difference
        of the templated conversation with and without them. Returns the ids and the history with
        the assistant turn and the observation."""
        tail = self.unsampled_closing(history, sampled_ids)
        with_turn = [*history, {"role": "assistant", "content": assistant_text}]
        closed = self.render(with_turn, generation_prompt=False)
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
