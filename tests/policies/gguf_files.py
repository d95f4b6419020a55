"""A GGUF file written here from a tiny Hugging Face Llama, the way llama.cpp's
``convert_hf_to_gguf.py`` writes one (its tensor names, its q/k row permutation, a ``gpt2``
byte-level BPE vocabulary with merges, the chat template), so that converting it back can be
checked exactly against the model it came from. F32 tensors: no quantisation error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

# HF parameter name (after "model.layers.{i}.") -> GGUF tensor name (after "blk.{i}.").
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of q/k rows (``LlamaModel.permute``), which transformers undoes on load."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_llama_gguf(folder: Path, path: Path) -> Path:
    """Write the Llama model folder ``folder`` (weights, tokenizer.json, chat template) to ``path``."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("polyrl tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    backend = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    # As convert_hf_to_gguf.py: tokenizer.json's special added tokens are CONTROL tokens.
    special = {added["content"] for added in backend["added_tokens"] if added["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    merges = backend["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for index in range(config.num_hidden_layers):
        for hf_name, gguf_name in LAYER_TENSORS.items():
            weights = state[f"model.layers.{index}.{hf_name}"]
            if hf_name.startswith("self_attn.q_proj"):
                weights = llama_cpp_permute(weights, config.num_attention_heads)
            elif hf_name.startswith("self_attn.k_proj"):
                weights = llama_cpp_permute(weights, config.num_key_value_heads)
            writer.add_tensor(f"blk.{index}.{gguf_name}", np.ascontiguousarray(weights))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not config.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
