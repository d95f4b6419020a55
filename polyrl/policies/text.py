"""Tiny text policies built from a transformers config, with a tokenizer built locally.

Nothing can be downloaded on the machines polyrl is developed on, so the platform builds its
own small Qwen3-architecture models and a character-level tokenizer with `tokenizers`. The
same downstream code takes any local Hugging Face model directory instead.

Why Qwen3 and not Qwen2: transformers 5 forces ``Qwen2Tokenizer`` (a byte-level BPE) onto any
folder whose config says ``model_type: qwen2``, whatever ``tokenizer_config.json`` names, and
that class silently drops this tokenizer's spaces. For ``qwen3`` it trusts the saved tokenizer
class, so transformers and vLLM load the same character tokenizer that was built here.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]

# Characters the synthetic tasks use; anything else maps to <unk>.
CHARACTERS = sorted(set(string.digits + string.ascii_letters + " +-*/=()?.,:;!#'\"\n<>[]{}_%&$@^|~\\"))

# Named sizes. Parameter counts are what `count_parameters` reports for the built model.
MODEL_SIZES: dict[str, dict[str, int]] = {
    # ~0.3M parameters: fast enough for unit tests and the vLLM-vs-HF small-model bench.
    "0.3m": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~3M parameters: the demo policy (learns arithmetic in a few minutes on 2 cores).
    "3m": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
    # ~30M parameters: the throughput-target policy of the benchmark.
    "30m": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=9, num_attention_heads=8, num_key_value_heads=4),
    # ~150M parameters: benches only (not a `model.builtin` size), to see how the update's share of
    # the matmul peak moves with width: element-wise work grows with the width, the products with its square.
    "150m": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8),
}


def build_char_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: every character is one token, no merges.

    Character-level keeps the arithmetic task learnable by a tiny model (digits are never
    glued into multi-digit tokens) and needs no training corpus.
    """
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
    )


def build_tiny_causal_lm(
    tokenizer: PreTrainedTokenizerFast,
    size: str = "0.3m",
    *,
    seed: int = 0,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 causal LM of a named size, deterministic for a seed.

    Embeddings are untied by default: vLLM's in-place weight reload does not refresh a tied
    output head (DESIGN.md), and an untied head costs little at this size.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; allowed: {sorted(MODEL_SIZES)}")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=10000.0,
        torch_dtype="float32",
        # Qwen3 defaults head_dim to 128 whatever the width; tiny models want hidden/heads.
        head_dim=MODEL_SIZES[size]["hidden_size"] // MODEL_SIZES[size]["num_attention_heads"],
        **MODEL_SIZES[size],
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def save_model_dir(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Write a Hugging Face model directory (safetensors weights + tokenizer) loadable by vLLM."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def build_random_text_model_dir(
    directory: str | Path, size: str = "0.3m", *, seed: int = 0, tie_word_embeddings: bool = False
) -> Path:
    """Build a tokenizer and a random tiny Qwen3 of ``size`` and save both to ``directory``."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, size, seed=seed, tie_word_embeddings=tie_word_embeddings)
    return save_model_dir(model, tokenizer, directory)


# Earlier name, kept for callers written against it.
build_tiny_qwen2 = build_tiny_causal_lm
