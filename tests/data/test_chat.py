"""Chat prompts (polyrl/data/chat.py) and where generation stops (polyrl/engines/stop_tokens.py).

The tiny chat model (tests/chat_models.py) has the two traps built in: its template writes BOS
and its tokenizer adds BOS on encode, and its end of turn (<|eot_id|>) is not its EOS.
"""

from __future__ import annotations

import pytest
import torch
from chat_models import EOT, build_bpe_chat_tokenizer
from transformers import AutoTokenizer

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.data.chat import ChatFormat, ChatTemplateError, format_prompts
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import load_prompt_dataset
from polyrl.engines.stop_tokens import end_of_turn_id, stop_token_ids
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs
from polyrl.tasks import arithmetic

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]

QUESTIONS = ["What is 9 - 3?", "hello", "Add 2 and 5."]
SETTINGS = SamplingSettings(n=8, temperature=1.0, max_tokens=24, seed=1)


@pytest.fixture(scope="module")
def tokenizer(chat_model_dir):
    return AutoTokenizer.from_pretrained(str(chat_model_dir))


def _samples(questions=QUESTIONS, **fields):
    return [PromptSample(prompt=q, references=["6"], fields=dict(fields)) for q in questions]


# -- formatting ------------------------------------------------------------------------------


def test_a_template_that_writes_bos_gets_it_once(tokenizer):
    bos = tokenizer.bos_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 9 - 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer(text)["input_ids"][:2] == [bos, bos]  # the trap: ordinary encoding doubles BOS
    [sample] = format_prompts(_samples(QUESTIONS[:1]), tokenizer, ChatFormat(chat_template=True))
    assert sample.prompt_ids[0] == bos and sample.prompt_ids.count(bos) == 1
    assert sample.model_prompt == text == tokenizer.decode(sample.prompt_ids)
    assert sample.model_prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")  # the generation prompt
    assert sample.prompt == "What is 9 - 3?" and sample.shown_prompt == text  # rewards: the user's text; tables: the model's


def test_system_prompt_and_messages_rows(tokenizer):
    [sample] = format_prompts(_samples(QUESTIONS[:1]), tokenizer, ChatFormat(chat_template=True, system_prompt="Be brief."))
    assert sample.model_prompt.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 9 - 3?<|eot_id|>"
    )
    # A messages column turns chat formatting on by itself (chat_template unset), and is used as given.
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "9 - 3?"},
    ]
    [row] = format_prompts(_samples(["9 - 3?"], messages=messages), tokenizer, ChatFormat())
    assert row.model_prompt.count("<|start_header_id|>") == 4 and "hello<|eot_id|>" in row.model_prompt
    # Off: the prompt goes as it is (no ids made here; the engine encodes the text).
    [plain] = format_prompts(_samples(QUESTIONS[:1], messages=messages), tokenizer, ChatFormat(chat_template=False))
    assert plain.prompt_ids is None and plain.model_prompt is None and plain.shown_prompt == "What is 9 - 3?"


def test_settings_that_cannot_apply_are_refused_naming_the_field(tokenizer):
    plain = build_bpe_chat_tokenizer(chat_template=None)
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template: true, but the tokenizer of /m has no chat template"):
        format_prompts(_samples(), plain, ChatFormat(chat_template=True), model="/m")
    with pytest.raises(ChatTemplateError, match=r"data\.messages_field: the rows carry a 'messages' column"):
        format_prompts(_samples(messages=[{"role": "user", "content": "x"}]), plain, ChatFormat())
    with pytest.raises(ChatTemplateError, match=r"data\.system_prompt: set, but prompts are not formatted"):
        format_prompts(_samples(), tokenizer, ChatFormat(system_prompt="Be brief."))
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template: row 0 has images"):
        format_prompts([PromptSample(prompt="<image> what?", images=[object()])], tokenizer, ChatFormat(chat_template=True))
    with pytest.raises(ChatTemplateError, match=r"data\.system_prompt: row 0's 'messages' start with their own system message"):
        format_prompts(
            _samples(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]),
            tokenizer,
            ChatFormat(system_prompt="Be brief."),
        )
    with pytest.raises(ChatTemplateError, match=r"ends with an assistant message"):
        format_prompts(
            _samples(messages=[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]), tokenizer, ChatFormat()
        )
    with pytest.raises(
        ChatTemplateError, match=r"datasets\[q\]\.system_prompt: the chat template of .* failed on row 0: .*no system"
    ):
        strict = build_bpe_chat_tokenizer(
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}x"
        )
        format_prompts(_samples(), strict, ChatFormat(chat_template=True, system_prompt="s", where="datasets[q]"))


def test_messages_only_rows_and_the_arithmetic_chat_source(tmp_path, tokenizer):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}\n')
    with pytest.raises(Exception, match="prompt field 'prompt' not found"):  # chat off: the prompt column is required
        load_prompt_dataset(str(path), "train")
    [sample] = rows_to_prompt_samples(
        load_prompt_dataset(str(path), "train", messages_field="messages"), messages_field="messages"
    )
    assert sample.prompt == "What is 2 + 2?" and sample.references == ["4"]  # rewards see the user's question
    # The shipped task in chat form: the same problems, ids and answers, worded as a question.
    plain = rows_to_prompt_samples(load_prompt_dataset("arithmetic", "test", limit=5))
    chat = rows_to_prompt_samples(
        load_prompt_dataset("arithmetic_chat", "test", limit=5, messages_field="messages"), messages_field="messages"
    )
    a, op, b = arithmetic.parse_prompt(plain[0].prompt)
    assert chat[0].prompt == f"What is {a} {op} {b}? Answer with the number only."
    assert [c.references for c in chat] == [p.references for p in plain] and [c.fields["id"] for c in chat] == [
        p.fields["id"] for p in plain
    ]
    [formatted] = format_prompts(chat[:1], tokenizer, ChatFormat())
    assert f"user<|end_header_id|>\n\nWhat is {a} {op} {b}?" in formatted.model_prompt
    # The free form asks the bare question, same problems and answers: the answer's form is the model's.
    free = rows_to_prompt_samples(
        load_prompt_dataset("arithmetic_chat_free", "test", limit=5, messages_field="messages"), messages_field="messages"
    )
    assert free[0].prompt == f"What is {a} {op} {b}?" and [f.references for f in free] == [p.references for p in plain]


# -- the end of a turn -----------------------------------------------------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
PHI3 = (
    "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
PLAIN_TEXT_TURNS = "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "specials", "eos", "expected"),
    [
        (CHATML, ("<|im_start|>", "<|im_end|>"), "<|endoftext|>", "<|im_end|>"),  # SmolLM2, Qwen
        (GEMMA, ("<start_of_turn>", "<end_of_turn>"), "<eos>", "<end_of_turn>"),
        (PHI3, ("<|user|>", "<|assistant|>", "<|end|>"), "<|endoftext|>", "<|end|>"),
        (MISTRAL, (), "</s>", "</s>"),  # the turn ends with EOS itself
        (PLAIN_TEXT_TURNS, (), "</s>", None),  # no token marks the end of a turn: EOS alone
        (None, (), "</s>", None),
    ],
)
def test_end_of_turn_is_read_off_the_template(template, specials, eos, expected):
    tokenizer = build_bpe_chat_tokenizer(template, bos="<s>", eos=eos, pad="<pad>", specials=specials, adds_bos=False)
    found = end_of_turn_id(tokenizer)
    assert (None if found is None else tokenizer.convert_ids_to_tokens(found)) == expected
    assert stop_token_ids(tokenizer) == {tokenizer.eos_token_id} | ({found} if found is not None else set())


def test_hf_engine_stops_at_the_end_of_turn_and_scores_it_like_the_learner(chat_model_dir):
    from transformers import AutoModelForCausalLM

    from polyrl.engines.hf_engine import HFRolloutEngine

    engine = HFRolloutEngine(str(chat_model_dir))
    check_stops_and_parity(engine, AutoModelForCausalLM.from_pretrained(str(chat_model_dir), dtype=torch.float32).eval())


def check_stops_and_parity(engine, learner) -> None:
    """Shared with the vLLM test: chat ids sent as made, generation ends at <|eot_id|> (kept as the
    last id, left out of the text), and its log-prob equals the learner's."""
    tokenizer = engine.tokenizer
    eot, bos, eos = tokenizer.convert_tokens_to_ids(EOT), tokenizer.bos_token_id, tokenizer.eos_token_id
    prompts = format_prompts(_samples(), tokenizer, ChatFormat(chat_template=True))
    completions = [c for group in engine.generate(prompts, SETTINGS) for c in group]
    for index, c in enumerate(completions):
        assert c.prompt_ids == prompts[index // SETTINGS.n].prompt_ids and c.prompt_ids.count(bos) == 1
        assert eot not in c.completion_ids[:-1] and eos not in c.completion_ids[:-1]
        if c.finish_reason == "stop":
            assert c.completion_ids[-1] in (eot, eos)
            assert c.text == tokenizer.decode(c.completion_ids[:-1], skip_special_tokens=True)
        else:
            assert len(c.completion_ids) == SETTINGS.max_tokens
        assert EOT not in c.text and "<|start_header_id|>" not in c.text
    ended_turn = [c for c in completions if c.completion_ids[-1] == eot]
    assert 0 < len(ended_turn) and any(c.finish_reason == "length" for c in completions)  # the model is end-of-turn prone
    batch = pack_completions(completions, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        learner_logprobs, _ = token_logprobs(learner, batch, temperature=SETTINGS.temperature)
    assert logprob_gap(batch.sampling_logprobs, learner_logprobs, batch.response_mask) < 1e-5
    for row, c in enumerate(completions):
        if c.finish_reason == "stop":  # the stop token (EOS or end of turn) is a scored response token on both sides
            last = len(c.completion_ids) - 1
            assert batch.response_mask[row, last] == 1
            assert abs(c.sampling_logprobs[-1] - float(learner_logprobs[row, last])) < 1e-5


@pytest.mark.slow
def test_vllm_engine_stops_at_the_end_of_turn_and_scores_it_like_the_learner(chat_model_dir):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from polyrl.engines.base import build_rollout_engine

    engine = build_rollout_engine("vllm", str(chat_model_dir), seed=0, kv_cache_gb=0.25, max_model_len=128)
    try:
        check_stops_and_parity(engine, AutoModelForCausalLM.from_pretrained(str(chat_model_dir), dtype=torch.float32).eval())
    finally:
        engine.close()
