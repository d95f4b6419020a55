"""Prompts the policy cannot take, and empty turns, are refused naming the rows (docs/bad-input.md).

Before: a prompt of 10,065 tokens into a model of 512 positions trained with exit 0 and only a
library warning in the log; an empty user turn trained silently."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from run_control import child_env
from transformers import AutoTokenizer

from polyrl.core.types import PromptSample
from polyrl.data.chat import ChatFormat, ChatTemplateError, format_prompts
from polyrl.data.errors import DataConfigError
from polyrl.data.prompt_lengths import check_prompt_lengths, model_positions, prompt_token_limit
from polyrl.data.prompt_samples import rows_to_prompt_samples


def test_the_limit_is_the_smaller_of_max_model_len_and_the_models_positions(random_policy_dir):
    assert model_positions(random_policy_dir) == 512
    limit, bound = prompt_token_limit(4096, random_policy_dir)
    assert limit == 512 and "the model's 512 positions" in bound and "rollout.max_model_len is 4,096" in bound
    assert prompt_token_limit(256, random_policy_dir) == (256, "rollout.max_model_len 256")
    assert prompt_token_limit(256, None) == (256, "rollout.max_model_len 256")


def test_a_prompt_of_limit_tokens_or_more_is_refused_naming_its_row(random_policy_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_policy_dir)
    short = "What is 2+2?"
    n_short = len(tokenizer(short, add_special_tokens=False)["input_ids"])
    long = "1+" * 6000 + "1"
    n_long = len(tokenizer(long, add_special_tokens=False)["input_ids"])
    assert n_long >= 512 > n_short
    samples = [PromptSample(prompt=short), PromptSample(prompt=long), PromptSample(prompt=short)]
    with pytest.raises(DataConfigError) as info:
        check_prompt_lengths(samples, tokenizer, limit=512, bound="rollout.max_model_len 512", source="rows.jsonl")
    assert str(info.value) == (
        f"data.source 'rows.jsonl': 1 of 3 prompts leave no position for a response: row 1 has {n_long:,} tokens; "
        "a prompt must be shorter than 512 tokens (rollout.max_model_len 512). Shorten or remove those rows, or raise "
        "rollout.max_model_len where the model has the positions"
    )
    # The bound itself: a prompt of exactly limit - 1 tokens leaves one position and passes; limit tokens does not.
    check_prompt_lengths(samples[:1], tokenizer, limit=n_short + 1, bound="b", source="s")
    with pytest.raises(DataConfigError, match=f"row 0 has {n_short} tokens"):
        check_prompt_lengths(samples[:1], tokenizer, limit=n_short, bound="b", source="s")
    # A chat prompt is counted by its own ids.
    with pytest.raises(DataConfigError, match="row 0 has 600 tokens"):
        check_prompt_lengths([PromptSample(prompt="hi", prompt_ids=[5] * 600)], tokenizer, limit=512, bound="b", source="s")


def test_an_empty_prompt_or_user_turn_is_refused_naming_the_row(chat_model_dir):
    with pytest.raises(DataConfigError, match=r"^row 1: the prompt is empty \(field 'prompt'\)"):
        rows_to_prompt_samples([{"prompt": "2+2?"}, {"prompt": "  "}])
    empty_turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}]
    with pytest.raises(ChatTemplateError, match=r"^row 0: field 'messages'\[1\] is an empty user turn"):
        rows_to_prompt_samples([{"messages": empty_turn}], messages_field="messages")
    # a row with a prompt column whose messages end in an empty turn is refused when it is formatted
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    samples = rows_to_prompt_samples([{"prompt": "2+2?", "messages": empty_turn}], messages_field="messages")
    with pytest.raises(ChatTemplateError, match="empty user turn"):
        format_prompts(samples, tokenizer, ChatFormat())


@pytest.mark.slow
def test_run_refuses_an_overlong_prompt_and_an_empty_turn(tmp_path, tiny_experiment, write_experiment):
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "1+" * 5032 + "1", "answer": "5033"}]  # 10,065 characters
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "empty.jsonl").write_text(json.dumps({"prompt": "", "answer": "1"}) + "\n" + json.dumps(rows[0]) + "\n")
    for source, says in (
        ("long.jsonl", "1 of 2 prompts leave no position for a response: row 1 has 10,065 tokens"),
        ("empty.jsonl", "row 0: the prompt is empty"),
    ):
        config = tiny_experiment(data={"source": source}, train={"steps": 1})
        path = write_experiment(tmp_path, config, f"{source}.yaml")
        ran = subprocess.run(
            [sys.executable, "-m", "polyrl.cli.main", "run", str(path), "--no-progress"],
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = ran.stdout + ran.stderr
        assert ran.returncode != 0, output  # before: exit 0, the long row trained with a library warning
        assert "Traceback" not in output and says in output, output
