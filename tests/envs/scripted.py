"""Tokenizers with tool-rendering and trimming chat templates, and an engine that plays scripted turns.

The templates are written here for the tests (not the models' own files); each keeps the one
trait under test:

- :data:`LLAMA3_TOOLS_TEMPLATE`: Llama-3-style headers, content trimmed, and tools rendered into
  the first user message with the instruction Llama 3.1/3.2 templates give: answer with a bare
  JSON object ``{"name": function name, "parameters": ...}``; tool results in an ``ipython`` turn;
- :data:`HERMES_TOOLS_TEMPLATE`: ChatML with the tools in a system block that asks for calls in
  ``<tool_call></tool_call>`` tags (Hermes, Qwen2.5);
- :data:`GEMMA_TEMPLATE`: Gemma-style turns, content trimmed, ``<end_of_turn>\\n`` after each.
"""

from __future__ import annotations

from polyrl.core.types import Completion
from polyrl.engines.stop_tokens import completion_text

LLAMA3_TOOLS_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(first=true) %}{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if tools is defined and tools and message['role'] == 'user' and ns.first %}{% set ns.first = false %}"
    "{% set ns.text = 'Given the following functions, respond with a JSON for a function call with its arguments.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n\' %}'
    "{% for t in tools %}{% set ns.text = ns.text + (t | tojson) + '\n\n' %}{% endfor %}"
    "{% set content = ns.text + content %}{% endif %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

HERMES_TOOLS_TEMPLATE = (
    "{% if tools is defined and tools %}<|im_start|>system\nYou may call functions; their signatures are in "
    "<tools></tools>:\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\nFor each call, write a JSON "
    'object {"name": ..., "arguments": ...} inside <tool_call></tool_call> tags.<|im_end|>\n{% endif %}'
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) "
    "+ '\n' + m['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def llama3_tools_tokenizer():
    from tests.chat_models import build_bpe_chat_tokenizer

    return build_bpe_chat_tokenizer(LLAMA3_TOOLS_TEMPLATE)


def gemma_tokenizer():
    from tests.chat_models import build_bpe_chat_tokenizer

    return build_bpe_chat_tokenizer(GEMMA_TEMPLATE, specials=("<start_of_turn>", "<end_of_turn>"))


def chatml_tokenizer(tiny_arch_dir, template: str | None = None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_arch_dir("qwen2"))
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


class ScriptedEngine:
    """Samples nothing: returns the next scripted turn's ids (cut at a stop string as both engines
    cut, text made by the engines' own completion_text), with made-up log-probs. ``end_of_turn``
    is the template's end-of-turn token, a stop token as the engines make it."""

    def __init__(self, tokenizer, turns, end_of_turn: str):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []
        self.end_of_turn = {tokenizer.convert_tokens_to_ids(end_of_turn)}

    def generate(self, prompts, settings):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt.prompt_ids))
            ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
            text = completion_text(self.tokenizer, ids, "stop", self.end_of_turn, settings.stop)
            out.append([Completion(list(prompt.prompt_ids), ids, text, [-0.5] * len(ids), "stop")])
        return out


def observation_text(tokenizer, episode, sampled_first: str) -> str:
    """The observation tokens after the first assistant turn (the turn's closing and the next messages), as text."""
    first = len(tokenizer(sampled_first, add_special_tokens=False)["input_ids"])
    mask = list(episode.completion_mask)
    end = first + mask[first:].index(1) if 1 in mask[first:] else len(mask)
    assert mask[:first] == [1] * first
    return tokenizer.decode(episode.completion_ids[first:end])
