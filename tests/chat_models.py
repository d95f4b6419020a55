"""A tiny chat model for the chat-template tests: a byte-level BPE tokenizer trained here with
``tokenizers`` on a few lines, a Llama-3-style chat template, and a random tiny Qwen3.

Two traps are built in on purpose:

* the template writes BOS itself (``{{ bos_token }}``) *and* the tokenizer adds BOS when it
  encodes (a ``<|begin_of_text|> $A`` post-processor, as Llama 3's does): encoding the rendered
  text the ordinary way gives BOS twice;
* the template ends an assistant turn with ``<|eot_id|>``, which is not the tokenizer's EOS
  (``<|end_of_text|>``), and the model directory's generation config names only EOS: an engine
  that stops at EOS alone runs past the end of the turn.

The model is "end-of-turn prone" (the trick of tests/engines/rollout_models.py): residual
dimension 0 is a constant no layer writes, and the head row of ``<|eot_id|>`` gets a bonus
through it, so about half of 24-token samples end the turn and the rest hit the length limit.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
HEADER_START, HEADER_END, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIALS = [BOS, EOS, PAD, HEADER_START, HEADER_END, EOT]

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

CORPUS = [
    "What is 17 + 25? The answer is 42.",
    "What is 9 - 3? The answer is 6.",
    "You are a helpful assistant. Answer with the number only.",
    "system user assistant: hello there, how are you today?",
    "Add the two numbers and give the result. 0 1 2 3 4 5 6 7 8 9 10 11 12",
    "The quick brown fox jumps over the lazy dog near the river bank.",
]


def build_bpe_chat_tokenizer(
    chat_template: str | None = LLAMA3_TEMPLATE,
    *,
    bos: str = BOS,
    eos: str = EOS,
    pad: str = PAD,
    specials: tuple[str, ...] = (HEADER_START, HEADER_END, EOT),
    adds_bos: bool = True,
    vocab_size: int = 320,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on :data:`CORPUS` with ``chat_template``; ``adds_bos``: it adds BOS
    when it encodes (a ``BOS $A`` post-processor, as Llama 3's tokenizer does)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[bos, eos, pad, *specials], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS * 4, trainer=trainer)
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=list(specials),
        chat_template=chat_template,
        model_max_length=512,
    )


def build_chat_model(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, eot_bonus: float = 0.12) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        torch_dtype="float32",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    eot = tokenizer.convert_tokens_to_ids(EOT)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[eot, 0] += eot_bonus
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def build_chat_model_dir(directory: str | Path, *, seed: int = 0) -> Path:
    """Save the tokenizer and the end-of-turn-prone model to ``directory`` (an HF folder)."""
    directory = Path(directory)
    tokenizer = build_bpe_chat_tokenizer()
    model = build_chat_model(tokenizer, seed=seed)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
