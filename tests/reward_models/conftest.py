"""Fixtures of the model-based reward tests: tiny sequence-classification models built from a config."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen3Config


def _scorer_dir(root, tokenizer_dir, num_labels: int):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    # Qwen3, as the chat model the tokenizer comes from: a folder whose config.json says qwen2 makes
    # transformers load this tokenizer as Qwen2Tokenizer, which adds '<|endoftext|>' as a 321st
    # token, past the embedding's 320 rows (refused by learned_scorer).
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_labels=num_labels,
        id2label={i: name for i, name in enumerate(["bad", "ok", "good"][:num_labels])} if num_labels > 1 else None,
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    folder = root / f"scorer_{num_labels}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def scorer_dirs(tmp_path_factory, chat_model_dir):
    root = tmp_path_factory.mktemp("scorers")
    return {n: _scorer_dir(root, chat_model_dir, n) for n in (1, 3)}
