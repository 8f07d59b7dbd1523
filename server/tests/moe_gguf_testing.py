"""A tiny Qwen3-MoE as a GGUF file written through the `gguf` package, as llama.cpp's converter lays it out: each
layer's experts in three 3-D stacks `ffn_{gate,up,down}_exps` `[experts, rows, columns]`, the router `ffn_gate_inp`."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import quantize
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

TINY_QWEN3_MOE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
_LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}


def tiny_qwen3_moe(seed: int = 0) -> Qwen3MoeForCausalLM:
    """A random tiny Qwen3-MoE whose weights are large enough to route tokens apart."""
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY_QWEN3_MOE))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.1)
    return model.eval()


def _stacks(model: Qwen3MoeForCausalLM, layer: int) -> dict[str, np.ndarray]:
    """A layer's experts as llama.cpp stacks them: gate and up `[experts, intermediate, hidden]`, down
    `[experts, hidden, intermediate]`."""
    experts = model.model.layers[layer].mlp.experts
    gate_up = experts.gate_up_proj.detach().float().numpy()
    intermediate = gate_up.shape[1] // 2
    return {
        f"blk.{layer}.ffn_gate_exps.weight": gate_up[:, :intermediate],
        f"blk.{layer}.ffn_up_exps.weight": gate_up[:, intermediate:],
        f"blk.{layer}.ffn_down_exps.weight": experts.down_proj.detach().float().numpy(),
    }


def write_tiny_qwen3_moe_gguf(
    path: Path, model: Qwen3MoeForCausalLM, expert_type: str, layer_type: str, up_type: str | None = None
) -> None:
    """`model` as a GGUF file: expert stacks in `expert_type` (the up stacks in `up_type` when given), other 2-D
    weights in `layer_type` (the router and norms float32), with a stand-in vocabulary."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(TINY_QWEN3_MOE["rope_theta"])
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    tensors["token_embd.weight"] = (state["model.embed_tokens.weight"], layer_type)
    tensors["output.weight"] = (state["lm_head.weight"], layer_type)
    tensors["output_norm.weight"] = (state["model.norm.weight"], "F32")
    for layer in range(config.num_hidden_layers):
        for hf, ggml in _LAYER_TENSORS.items():
            values = state[f"model.layers.{layer}.{hf}"]
            kind = layer_type if values.ndim == 2 and "gate_inp" not in ggml else "F32"
            tensors[f"blk.{layer}.{ggml}"] = (values, kind)
        for name, values in _stacks(model, layer).items():
            kind = up_type if up_type is not None and "ffn_up_exps" in name else expert_type
            tensors[name] = (np.ascontiguousarray(values), kind)
    for name, (values, kind) in tensors.items():
        quant_type = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, quantize(values, quant_type), raw_dtype=quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
