"""Tiny mixture-of-experts models (Qwen3-MoE, Mixtral, OLMoE) as GGUF files written through the `gguf` package, as
llama.cpp's converter lays them out: each layer's experts in three 3-D stacks `ffn_{gate,up,down}_exps`
`[experts, rows, columns]`, the router `ffn_gate_inp`, and for the `llama` architecture (Mixtral) the q/k rows
permuted as llama.cpp permutes them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.quants import dequantize, quantize
from transformers import (
    MixtralForCausalLM,
    OlmoeForCausalLM,
    PreTrainedModel,
    Qwen3MoeForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

_TINY_SHAPE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
TINY_QWEN3_MOE = _TINY_SHAPE | {
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 6,
    "norm_topk_prob": True,
}
TINY_MIXTRAL = _TINY_SHAPE | {"intermediate_size": 32, "num_local_experts": 6}
TINY_OLMOE = _TINY_SHAPE | {"intermediate_size": 32, "num_experts": 6, "norm_topk_prob": False}
_ATTENTION_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
_QK_NORMS = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}


@dataclass(frozen=True)
class MoeGgufFamily:
    """How llama.cpp writes one family: its architecture, its per-layer tensors and the metadata beyond the shared
    keys."""

    architecture: str
    model_class: type[PreTrainedModel]
    config: dict[str, Any]
    layer_tensors: dict[str, str]
    extra_metadata: Callable[[gguf.GGUFWriter, Any], None] = field(default=lambda writer, config: None)
    permutes_qk: bool = False


QWEN3_MOE = MoeGgufFamily(
    "qwen3moe",
    Qwen3MoeForCausalLM,
    TINY_QWEN3_MOE,
    _ATTENTION_TENSORS | _QK_NORMS,
    lambda writer, config: writer.add_expert_feed_forward_length(config.moe_intermediate_size),
)
MIXTRAL = MoeGgufFamily("llama", MixtralForCausalLM, TINY_MIXTRAL, _ATTENTION_TENSORS, permutes_qk=True)
OLMOE = MoeGgufFamily("olmoe", OlmoeForCausalLM, TINY_OLMOE, _ATTENTION_TENSORS | _QK_NORMS)


def tiny_moe(family: MoeGgufFamily, seed: int = 0) -> PreTrainedModel:
    """A random tiny model of `family` whose weights are large enough to route tokens apart."""
    torch.manual_seed(seed)
    model = family.model_class(family.model_class.config_class(**family.config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.1)
    return model.eval()


def tiny_qwen3_moe(seed: int = 0) -> PreTrainedModel:
    """A random tiny Qwen3-MoE."""
    return tiny_moe(QWEN3_MOE, seed)


def _stacks(model: PreTrainedModel, layer: int) -> dict[str, np.ndarray]:
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


def _permuted(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for the `llama` architecture: each head's two rotary halves interleaved."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _write_metadata(writer: gguf.GGUFWriter, family: MoeGgufFamily, config: Any) -> None:
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(family.config["rope_theta"])
    writer.add_expert_count(family.config.get("num_experts", family.config.get("num_local_experts")))
    writer.add_expert_used_count(config.num_experts_per_tok)
    family.extra_metadata(writer, config)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    # One token per byte (GPT-2's byte-level characters): ASCII text encodes byte by byte, without merges.
    byte_chars = bytes_to_unicode()
    writer.add_token_list([byte_chars[byte] for byte in range(config.vocab_size)])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def _gguf_tensors(
    model: PreTrainedModel, family: MoeGgufFamily, expert_type: str, layer_type: str, up_type: str | None
) -> dict[str, tuple[str, np.ndarray, str]]:
    """GGUF name -> (transformers name, or "" for an expert stack, values in transformers' layout, GGUF type)."""
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    tensors = {
        "token_embd.weight": ("model.embed_tokens.weight", state["model.embed_tokens.weight"], layer_type),
        "output.weight": ("lm_head.weight", state["lm_head.weight"], layer_type),
        "output_norm.weight": ("model.norm.weight", state["model.norm.weight"], "F32"),
    }
    for layer in range(model.config.num_hidden_layers):
        for hf, ggml in family.layer_tensors.items():
            hf_name = f"model.layers.{layer}.{hf}"
            kind = layer_type if state[hf_name].ndim == 2 and "gate_inp" not in ggml else "F32"
            tensors[f"blk.{layer}.{ggml}"] = (hf_name, state[hf_name], kind)
        for name, values in _stacks(model, layer).items():
            kind = up_type if up_type is not None and "ffn_up_exps" in name else expert_type
            tensors[name] = ("", np.ascontiguousarray(values), kind)
    return tensors


def write_moe_gguf(
    path: Path,
    model: PreTrainedModel,
    family: MoeGgufFamily,
    types: tuple[str, str],
    up_type: str | None = None,
    omit: str | None = None,
) -> PreTrainedModel:
    """`model` as a GGUF file: expert stacks in `types[0]` (the up stacks in `up_type` when given), other 2-D
    weights in `types[1]` (the router and norms float32), with a vocabulary of the first `vocab_size` bytes. Returns
    a copy of `model` holding the values the file's tensors dequantize to. Tensors whose name contains `omit` are left
    out."""
    expert_type, layer_type = types
    config = model.config
    writer = gguf.GGUFWriter(str(path), family.architecture)
    _write_metadata(writer, family, config)
    dequantized = copy.deepcopy(model)
    values_of = dict(dequantized.state_dict())
    heads = {"attn_q.weight": config.num_attention_heads, "attn_k.weight": config.num_key_value_heads}
    for name, (hf_name, values, kind) in _gguf_tensors(model, family, expert_type, layer_type, up_type).items():
        if omit is not None and omit in name:
            continue
        quant_type = gguf.GGMLQuantizationType[kind]
        blocks = quantize(values, quant_type)
        if hf_name:
            values_of[hf_name].copy_(torch.from_numpy(dequantize(blocks, quant_type).reshape(values.shape)))
        else:
            _set_stack(dequantized, name, torch.from_numpy(dequantize(blocks, quant_type).reshape(values.shape)))
        suffix = name.split(".", 2)[-1]
        if family.permutes_qk and suffix in heads:
            blocks = _permuted(blocks, heads[suffix])
        writer.add_tensor(name, blocks, raw_dtype=quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantized.eval()


def _set_stack(model: PreTrainedModel, gguf_name: str, values: torch.Tensor) -> None:
    _, layer, part = gguf_name.split(".", 2)
    experts = model.model.layers[int(layer)].mlp.experts
    with torch.no_grad():
        if part.startswith("ffn_down_exps"):
            experts.down_proj.copy_(values)
            return
        half = experts.gate_up_proj.shape[1] // 2
        rows = slice(0, half) if part.startswith("ffn_gate_exps") else slice(half, 2 * half)
        experts.gate_up_proj[:, rows].copy_(values)


def write_tiny_qwen3_moe_gguf(
    path: Path, model: PreTrainedModel, expert_type: str, layer_type: str, up_type: str | None = None
) -> None:
    """`model` (a tiny Qwen3-MoE) as a GGUF file, as `write_moe_gguf` writes it."""
    write_moe_gguf(path, model, QWEN3_MOE, (expert_type, layer_type), up_type)
