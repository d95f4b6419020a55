"""Tool calls parsed in the format the prompt asked for (env.tool_parser), and the choice said.

A Llama-3-style template asks for bare JSON calls; before env.tool_parser, calls were parsed as
Hermes <tool_call> tags only, so a call written as asked was scored as the final answer (0 tool
calls, return 0, nothing said)."""

from __future__ import annotations

import pytest

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.envs import EnvConfigError, parse_tool_calls, tool_protocol_text
from polyrl.envs.builtins.calculator import CalculatorEnv, calculator
from polyrl.rollout.chat_render import ChatRenderer, resolve_tool_choice
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings
from tests.envs.scripted import (
    HERMES_TOOLS_TEMPLATE,
    ScriptedEngine,
    chatml_tokenizer,
    llama3_tools_tokenizer,
    observation_text,
)

QUESTION = PromptSample("What is 123 * 45?", fields={"answer": 5535})
LLAMA_CALL = '{"name": "calculator", "parameters": {"expression": "123 * 45"}}'
HERMES_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>'


def play(tokenizer, turns, end_of_turn, **settings):
    engine = ScriptedEngine(tokenizer, turns, end_of_turn)
    runner = EpisodeRunner(CalculatorEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400, **settings))
    (group,) = runner.run(engine, [QUESTION], SamplingSettings(n=1))
    return runner, group[0]


def test_a_llama3_template_gets_its_json_calls_parsed():
    tokenizer = llama3_tools_tokenizer()
    first = LLAMA_CALL + "<|eot_id|>"
    runner, episode = play(tokenizer, [first, "It is 5535.<|eot_id|>"], "<|eot_id|>")
    assert runner.renderer.tool_parser == "llama3_json" and runner.renderer.template_tools
    assert "llama3_json" in runner.tool_note and "chat template" in runner.tool_note
    # The call ran (before: tool_calls 0, the call scored as a wrong final answer, return 0).
    record = episode.episode
    assert (record["tool_calls"], record["tool_errors"], record["return"], record["end"]) == (1, 0, 1.0, "done")
    # Its result came back in the template's own tool turn (ipython), after the sampled <|eot_id|>.
    assert observation_text(tokenizer, episode, first) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n5535<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # The policy was asked in the template's words, not the plain-text protocol.
    prompt = tokenizer.decode(episode.prompt_ids)
    assert '"parameters": dictionary of argument name' in prompt and "<tool_call>" not in prompt


def test_a_hermes_template_gets_tags_parsed_and_bare_json_is_an_answer(tiny_arch_dir):
    tokenizer = chatml_tokenizer(tiny_arch_dir, HERMES_TOOLS_TEMPLATE)
    runner, episode = play(tokenizer, [HERMES_CALL + "<|im_end|>", "It is 5535.<|im_end|>"], "<|im_end|>")
    assert (runner.renderer.tool_parser, runner.renderer.template_tools) == ("hermes", True)
    assert (episode.episode["tool_calls"], episode.episode["return"]) == (1, 1.0)
    # A bare JSON object is not a call in the Hermes format: the final answer (wrong: return 0).
    _, episode = play(tokenizer, [LLAMA_CALL + "<|im_end|>"], "<|im_end|>")
    assert (episode.episode["tool_calls"], episode.episode["return"], episode.episode["assistant_turns"]) == (0, 0.0, 1)


def test_a_template_without_tools_falls_back_to_the_text_protocol(tiny_arch_dir):
    tokenizer = chatml_tokenizer(tiny_arch_dir)  # ChatML without tools=
    choice = resolve_tool_choice(tokenizer, [calculator])
    assert (choice.template_tools, choice.parser) == (False, "hermes")
    assert "plain-text protocol" in choice.note and "renders no tools=" in choice.note
    renderer = ChatRenderer(tokenizer, [calculator])
    assert renderer.system_text == tool_protocol_text([calculator], "hermes")


def test_the_text_protocol_asks_in_the_parser_format(tiny_arch_dir):
    tokenizer = llama3_tools_tokenizer()
    renderer = ChatRenderer(tokenizer, [calculator], tool_format="text", tool_parser="llama3_json")
    assert not renderer.template_tools and renderer.tool_parser == "llama3_json"
    assert '{"name": "<tool name>", "parameters": {<arguments>}}' in renderer.system_text
    assert "<tool_call>" not in renderer.system_text
    assert "env.tool_format: text" in renderer.tool_note


@pytest.mark.parametrize(
    ("template_kind", "settings", "text"),
    [
        # The template asks for bare JSON; parsing tags would score every call as an answer.
        ("llama3", {"tool_parser": "hermes"}, "env.tool_parser: hermes, but the policy's chat template asks for bare JSON"),
        ("hermes", {"tool_parser": "llama3_json"}, "asks for calls in <tool_call> tags"),
        ("plain", {"tool_format": "template"}, "env.tool_format: template, but the policy's chat template does not render"),
        ("unknown", {"tool_format": "template"}, "a call format polyrl does not recognise"),
    ],
)
def test_disagreements_are_refused_naming_the_field(tiny_arch_dir, template_kind, settings, text):
    tokenizer = {
        "llama3": llama3_tools_tokenizer,
        "hermes": lambda: chatml_tokenizer(tiny_arch_dir, HERMES_TOOLS_TEMPLATE),
        "plain": lambda: chatml_tokenizer(tiny_arch_dir),
        "unknown": lambda: chatml_tokenizer(tiny_arch_dir, HERMES_TOOLS_TEMPLATE.replace("<tool_call></tool_call> tags", "XML")),
    }[template_kind]()
    with pytest.raises(EnvConfigError, match="env.tool_") as caught:
        ChatRenderer(tokenizer, [calculator], **settings)
    assert text in str(caught.value)


def test_an_unknown_template_format_with_auto_falls_back_and_with_a_parser_is_trusted(tiny_arch_dir):
    tokenizer = chatml_tokenizer(tiny_arch_dir, HERMES_TOOLS_TEMPLATE.replace("<tool_call></tool_call> tags", "XML"))
    auto = resolve_tool_choice(tokenizer, [calculator])
    assert (auto.template_tools, auto.parser) == (False, "hermes") and "does not recognise" in auto.note
    named = resolve_tool_choice(tokenizer, [calculator], tool_parser="llama3_json")
    assert (named.template_tools, named.parser) == (True, "llama3_json") and "env.tool_parser says" in named.note


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (LLAMA_CALL, [("calculator", {"expression": "123 * 45"}, None)]),
        ("<|python_tag|>" + LLAMA_CALL, [("calculator", {"expression": "123 * 45"}, None)]),
        ('  {"name": "a", "arguments": {"x": 1}}; {"name": "b", "parameters": {}}\n', [("a", {"x": 1}, None), ("b", {}, None)]),
        ('{"name": "a", "parameters": "{\\"x\\": 2}"}', [("a", {"x": 2}, None)]),  # arguments as a JSON string
        ('{"name": "a", "parameters": [1]}', [("a", {}, '"parameters" must be a JSON object')]),
        ('{"name": "a", "parameters": {', [(None, {}, "the tool call is not valid JSON (Expecting property name")]),
        ('{"name": 3}', [(None, {}, 'a tool call must be a JSON object with a "name" string')]),
        ("The answer is 5535.", []),
        ('{"answer": 5535}', []),  # JSON, but no call
        ("I would call " + LLAMA_CALL, []),  # the turn must be the call
        (HERMES_CALL, []),
    ],
)
def test_llama3_json_parser(text, expected):
    calls = parse_tool_calls(text, "llama3_json")
    assert [(c.name, c.arguments, c.error and c.error[: len(e[2])]) for c, e in zip(calls, expected)] == expected
    assert len(calls) == len(expected)


def test_an_unknown_parser_name_is_refused():
    with pytest.raises(ValueError, match="allowed: hermes, llama3_json"):
        parse_tool_calls("x", "xml")
