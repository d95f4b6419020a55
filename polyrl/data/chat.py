"""Chat prompts: each prompt formatted through the tokenizer's chat template, once.

A pretrained instruct model expects its own conversation format (``<|im_start|>user ...``);
given a bare ``Q: 76+4=? A:`` it writes unrelated prose. With ``data.chat_template: true`` (or
rows carrying a ``messages`` column) every prompt becomes a conversation — the row's messages,
or one user message holding the prompt, after ``data.system_prompt`` when one is set — rendered
with ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` and encoded here, once.
The result rides on the :class:`~polyrl.core.types.PromptSample`: ``prompt_ids`` are what both
rollout engines send and what the learner scores (from the completions), and the eval harness
formats its prompts the same way; ``model_prompt`` (the rendered text) is what sample tables
show. ``prompt`` stays the user's text, which rewards see.

Special tokens are never doubled. A template that writes BOS itself (``{{ bos_token }}``: Llama
3, Gemma, Mistral) and a tokenizer that adds BOS when it encodes would give BOS twice; the
rendered text is therefore encoded with ``add_special_tokens=False`` (transformers' own
``apply_chat_template(tokenize=True)`` does the same: the template is the one authority on
special tokens), and a prompt that still starts with two BOS is refused.

Generation stops at EOS and at the template's end-of-turn token in both engines
(:mod:`polyrl.engines.stop_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyrl.core.types import PromptSample
from polyrl.data.errors import DataConfigError


class ChatTemplateError(DataConfigError):
    """A chat setting that cannot be applied (names the field path)."""


@dataclass(frozen=True)
class ChatFormat:
    """How prompts are formatted. ``chat_template``: True, False, or None (auto: on when the rows
    carry ``messages_field``). ``where``: the settings' field path prefix in error messages."""

    chat_template: bool | None = None
    system_prompt: str | None = None
    messages_field: str = "messages"
    where: str = "data"

    @property
    def rows_messages_field(self) -> str | None:
        """The messages column the loader may take the prompt from (None when chat is off)."""
        return None if self.chat_template is False else self.messages_field


def checked_messages(value: Any, *, index: int, field: str) -> list[dict[str, str]]:
    """A row's ``messages``: a non-empty list of ``{role, content}`` with string values."""
    where = f"row {index}: field {field!r}"
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        raise ChatTemplateError(f"{where} must be a non-empty list of {{role, content}} messages, got {value!r:.200}")
    messages = []
    for position, message in enumerate(value):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ChatTemplateError(f"{where}[{position}] must be {{role: str, content: str}}, got {message!r:.200}")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] == "assistant":
        raise ChatTemplateError(f"{where} ends with an assistant message; a prompt ends with the turn the model answers (user)")
    if messages[-1]["role"] == "user" and not messages[-1]["content"].strip():
        # An empty turn trained silently: the model answered nothing, and every score of the row meant nothing.
        raise ChatTemplateError(f"{where}[{len(messages) - 1}] is an empty user turn; give the turn the model answers its text")
    return messages


def last_user_text(value: Any, *, index: int, field: str) -> str:
    """The text of a row's last user message: the prompt rewards see for a messages-only row."""
    users = [m["content"] for m in checked_messages(value, index=index, field=field) if m["role"] == "user"]
    if not users:
        raise ChatTemplateError(f"row {index}: field {field!r} has no user message")
    return users[-1]


def chat_in_effect(fmt: ChatFormat, samples: Sequence[PromptSample]) -> bool:
    if fmt.chat_template is not None:
        return fmt.chat_template
    return any(s.fields.get(fmt.messages_field) is not None for s in samples)


def conversation(sample: PromptSample, fmt: ChatFormat, index: int) -> list[dict[str, str]]:
    """The messages of one prompt: the row's own, or one user message; the system prompt first."""
    own = sample.fields.get(fmt.messages_field)
    messages = (
        checked_messages(own, index=index, field=fmt.messages_field)
        if own is not None
        else [{"role": "user", "content": sample.prompt}]
    )
    if fmt.system_prompt is not None:
        if messages[0]["role"] == "system":
            raise ChatTemplateError(
                f"{fmt.where}.system_prompt: row {index}'s {fmt.messages_field!r} start with their own system "
                f"message; keep one of the two"
            )
        messages = [{"role": "system", "content": fmt.system_prompt}, *messages]
    return messages


def render(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """The rendered prompt (generation prompt appended) and its ids, special tokens as the
    template writes them (see the module docstring)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return text, ids


def _no_template(fmt: ChatFormat, explicit: bool, model: str) -> ChatTemplateError:
    if explicit:
        return ChatTemplateError(
            f"{fmt.where}.chat_template: true, but the tokenizer of {model} has no chat template "
            f"(tokenizer.chat_template is empty); allowed: chat_template: false, or a model whose tokenizer has one"
        )
    return ChatTemplateError(
        f"{fmt.where}.messages_field: the rows carry a {fmt.messages_field!r} column, which is formatted "
        f"through the tokenizer's chat template, but the tokenizer of {model} has none; give the rows a prompt "
        f"column and set {fmt.where}.chat_template: false, or use a model whose tokenizer has a template"
    )


def format_prompts(
    samples: Sequence[PromptSample], tokenizer: Any, fmt: ChatFormat, *, model: str = "the policy"
) -> list[PromptSample]:
    """``samples`` with ``model_prompt`` and ``prompt_ids`` set when chat formatting is in effect
    (unchanged otherwise). Raises :class:`ChatTemplateError` naming the field for every setting
    that cannot apply: no template, image prompts, a system prompt without chat formatting."""
    samples = list(samples)
    if not chat_in_effect(fmt, samples):
        if fmt.system_prompt is not None:
            raise ChatTemplateError(
                f"{fmt.where}.system_prompt: set, but prompts are not formatted through a chat template "
                f"({fmt.where}.chat_template is {fmt.chat_template}, no {fmt.messages_field!r} column); "
                f"set {fmt.where}.chat_template: true, or remove system_prompt"
            )
        return samples
    if not getattr(tokenizer, "chat_template", None):
        raise _no_template(fmt, fmt.chat_template is True, model)
    with_images = next((i for i, s in enumerate(samples) if s.images), None)
    if with_images is not None:
        raise ChatTemplateError(
            f"{fmt.where}.chat_template: row {with_images} has images; image prompts are built by the model's "
            f"processor, not a chat template, here; allowed for image data: chat_template: false"
        )
    bos = getattr(tokenizer, "bos_token_id", None)
    out = []
    for index, sample in enumerate(samples):
        messages = conversation(sample, fmt, index)
        try:
            text, ids = render(tokenizer, messages)
        except Exception as error:  # noqa: BLE001 - jinja templates raise their own errors (e.g. "System role not supported")
            field = "system_prompt" if fmt.system_prompt is not None else "chat_template"
            raise ChatTemplateError(
                f"{fmt.where}.{field}: the chat template of {model} failed on row {index}: {type(error).__name__}: {error}"
            ) from error
        if bos is not None and ids[:2] == [bos, bos]:
            raise ChatTemplateError(
                f"{fmt.where}.chat_template: row {index} renders to a prompt starting with BOS twice "
                f"({text[:80]!r}); the template or the row writes BOS itself"
            )
        out.append(dataclasses.replace(sample, model_prompt=text, prompt_ids=ids))
    return out
