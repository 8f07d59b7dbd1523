"""Tiny quantized GGUF models written through the `gguf` package, as llama.cpp's converter lays them out."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import quantize
from transformers import LlamaConfig, LlamaForCausalLM

TINY_LLAMA = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
_LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_names(num_layers: int) -> dict[str, str]:
    """transformers parameter name -> GGUF tensor name for a Llama."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for layer in range(num_layers):
        for hf, ggml in _LAYER_TENSORS.items():
            names[f"model.layers.{layer}.{hf}.weight"] = f"blk.{layer}.{ggml}.weight"
    return names


def write_tiny_llama_gguf(path: Path, layer_type: str, embedding_type: str = "Q8_0", seed: int = 0) -> None:
    """A random tiny Llama as a GGUF file: 2-D layer weights in `layer_type`, the tied embedding in
    `embedding_type`, norms in float32, q/k rows permuted as llama.cpp stores them, and a stand-in vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA)
    model = LlamaForCausalLM(config)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = gguf_names(config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name not in names:
            continue
        values = tensor.numpy().astype(np.float32)
        if "q_proj" in hf_name:
            values = _llama_cpp_permute(values, config.num_attention_heads)
        elif "k_proj" in hf_name:
            values = _llama_cpp_permute(values, config.num_key_value_heads)
        if values.ndim == 2:
            kind = gguf.GGMLQuantizationType[embedding_type if "embed" in hf_name else layer_type]
            writer.add_tensor(names[hf_name], quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(names[hf_name], values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _llama_cpp_permute(values: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp interleaves each head's rotary halves; transformers undoes it when it reads the file.
    halves = values.reshape(heads, 2, values.shape[0] // heads // 2, *values.shape[1:])
    return halves.swapaxes(1, 2).reshape(values.shape)
