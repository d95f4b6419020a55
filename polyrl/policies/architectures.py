"""Tiny random causal LMs of the common open architectures, each with a BPE tokenizer trained
here and a chat template: ordinary Hugging Face folders, as a downloaded model would be.

They exist to show that polyrl takes *any* causal LM folder (vLLM rollouts, weight sync,
training with either engine, checkpoints, ``polyrl eval``), not only its own Qwen3 with a
character tokenizer. Nothing is downloaded: the configs are transformers' own classes with
small dimensions, and the tokenizer is a byte-level BPE trained with ``tokenizers`` on text
that ships with polyrl (its Python sources and task files), so it covers every byte and has
merges, special tokens and a ChatML chat template like a real one.

Head size 32: vLLM's CPU attention backend supports a fixed set of head sizes (32 is the
smallest, as the 0.3m Qwen3 uses).

Two hybrids (:data:`HYBRIDS`: Falcon-H1, LFM2) mix tokens outside attention; the learner's packed
forwards and its decoder → head shortcut are probed at set-up (:mod:`polyrl.modeling.probes`)
and refused for them. Falcon-H1 trains with either engine; LFM2 with the HF engine (vLLM 0.32's
CPU build does not load it with transformers 5.19).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from polyrl.policies.text import save_model_dir

BOS_TOKEN = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"  # end of turn, and the tokenizer's EOS: generation stops at it
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = [BOS_TOKEN, TURN_START, TURN_END, PAD_TOKEN]

# ChatML, as Qwen and SmolLM2 use; `bos_template` prepends the tokenizer's BOS the way Llama-3
# and Gemma templates do.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Dimensions shared by every architecture (~0.3M parameters with a 512-token vocabulary).
TINY_DIMS: dict[str, int] = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
HEAD_DIM = TINY_DIMS["hidden_size"] // TINY_DIMS["num_attention_heads"]

# model_type -> (transformers config class name, settings beyond TINY_DIMS, ties embeddings by default).
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "llama": ("LlamaConfig", {"head_dim": HEAD_DIM}, False),
    "qwen2": ("Qwen2Config", {}, False),
    "qwen3": ("Qwen3Config", {"head_dim": HEAD_DIM}, False),
    "mistral": ("MistralConfig", {"head_dim": HEAD_DIM, "sliding_window": None}, False),
    # Gemma 3 (text): sliding-window layers beside global ones, q/k norms, scaled embeddings.
    "gemma3_text": (
        "Gemma3TextConfig",
        {
            "head_dim": HEAD_DIM,
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        True,
    ),
    # Gemma 2: soft-capped attention and final logits, alternating sliding-window layers.
    "gemma2": ("Gemma2Config", {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 16}, True),
    # Phi-3: fused qkv and gate/up projections.
    "phi3": ("Phi3Config", {}, False),
    # Hybrids, where tokens also meet outside attention (polyrl.modeling.probes refuses to pack them).
    # Falcon-H1: a Mamba-2 mixer beside attention in every layer (transformers' torch fallback on
    # CPU, no mamba_ssm kernels needed), and a logit multiplier after the output head, as the
    # released configs carry (muP), so the decoder -> head shortcut does not apply.
    "falcon_h1": (
        "FalconH1Config",
        {
            "head_dim": HEAD_DIM,
            "mamba_d_ssm": 128,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_d_state": 16,
            "mamba_chunk_size": 16,
            "lm_head_multiplier": 0.5,
        },
        False,
    ),
    # LFM2: short-convolution layers beside attention layers (the mixers in separate layers).
    "lfm2": ("Lfm2Config", {"layer_types": ["conv", "full_attention"]}, True),
}
# Architectures whose layers mix tokens outside attention (a state-space or convolution mixer).
HYBRIDS = ("falcon_h1", "lfm2")


def shipped_text() -> list[str]:
    """Text that ships with polyrl, as a tokenizer training corpus: its sources and task files."""
    package = Path(__file__).resolve().parents[1]
    files = sorted(p for pattern in ("**/*.py", "**/*.jsonl") for p in package.glob(pattern))
    return [p.read_text(encoding="utf-8") for p in files]


def build_bpe_tokenizer(
    vocab_size: int = 512, *, chat_template: str = CHATML_TEMPLATE, corpus: list[str] | None = None, model_max_length: int = 512
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style: every byte is a base token, so nothing is unknown) trained
    on ``corpus`` (default :func:`shipped_text`), with ChatML special tokens and ``chat_template``."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus if corpus is not None else shipped_text(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=TURN_END,
        pad_token=PAD_TOKEN,
        chat_template=chat_template,
        model_max_length=model_max_length,
    )


def tiny_config(
    model_type: str,
    tokenizer: PreTrainedTokenizerFast,
    *,
    tied: bool | None = None,
    max_position_embeddings: int = 512,
    **overrides: Any,
):
    """The transformers config of a tiny ``model_type`` model for ``tokenizer``'s vocabulary
    (``overrides``: settings that replace the architecture's own, e.g. ``lm_head_multiplier=1.0``)."""
    import transformers

    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {model_type!r}; allowed: {', '.join(ARCHITECTURES)}")
    class_name, settings, tied_default = ARCHITECTURES[model_type]
    return getattr(transformers, class_name)(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tied_default if tied is None else tied,
        **{**TINY_DIMS, **settings, **overrides},
    )


def build_tiny_arch_dir(
    model_type: str,
    directory: str | Path,
    *,
    tied: bool | None = None,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> Path:
    """A random tiny ``model_type`` causal LM and its BPE tokenizer saved as a Hugging Face folder
    (``tied``: share the embedding with the output head; default: the architecture's own default)."""
    tokenizer = tokenizer or build_bpe_tokenizer()
    config = tiny_config(model_type, tokenizer, tied=tied)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return save_model_dir(model, tokenizer, directory)
