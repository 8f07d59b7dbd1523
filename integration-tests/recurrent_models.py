"""Small random hybrids that speak the embedded model's tokenizer, and the limits the recurrent-layer launcher tests
serve them under: Qwen3.5 (Gated DeltaNet layers beside gated attention), Qwen3-Next (the same with experts),
Granite 4.0-H (Mamba-2 layers beside attention without rotary, Granite's multipliers, routed experts beside the shared
MLP) and Nemotron-H (Mamba-2, attention, relu² MLP and expert blocks per `hybrid_override_pattern`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tandem_harness import FLOAT32_EAGER, embedded_model_dir
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

# Mamba-2: attention on one layer in three, the others a convolution state and a scan memory, no KV blocks.
MAMBA2_LAYERS = ["mamba", "attention", "mamba"]
MAX_TOTAL_TOKENS = 256
# The longest prompt takes two steps to prefill, the first crossing a delta-rule chunk (64 tokens) and each the
# Mamba-2 scan's (32).
PREFILL_CHUNK = 80
MAX_BATCH_SIZE = 3
LONG_PROMPT = " ".join(
    f"On day {day} the keeper of the lighthouse wrote down the wind, the tide and every passing ship."
    for day in range(1, 7)
)
PROMPTS = ("The capital of France is", "def fibonacci(n):\n", LONG_PROMPT)

# Gated DeltaNet: attention on one layer in three, the others a convolution state and a delta-rule memory.
GATED_DELTA_NET_LAYERS = ["linear_attention", "full_attention", "linear_attention"]
# Qwen3-Next: the same layers with a mixture of experts (a gated shared expert beside them) after each.
EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
}

ModelBuilder = Callable[[dict[str, int]], PreTrainedModel]


def gated_delta_net(
    config_class: type[PretrainedConfig], model_class: type[PreTrainedModel], **extra: Any
) -> ModelBuilder:
    def build(tokens: dict[str, int]) -> PreTrainedModel:
        config = config_class(
            **tokens,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=len(GATED_DELTA_NET_LAYERS),
            layer_types=GATED_DELTA_NET_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            max_position_embeddings=MAX_TOTAL_TOKENS,
            initializer_range=0.2,
            **extra,
        )
        return model_class(config)

    return build


def granite_hybrid(groups: int) -> ModelBuilder:
    """Granite 4.0-H with `groups` Mamba-2 groups over its four heads (the published checkpoints have one)."""

    def build(tokens: dict[str, int]) -> PreTrainedModel:
        config = GraniteMoeHybridConfig(
            **tokens,
            hidden_size=64,
            intermediate_size=32,
            shared_intermediate_size=96,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=len(MAMBA2_LAYERS),
            layer_types=MAMBA2_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            mamba_n_heads=4,
            mamba_n_groups=groups,
            mamba_d_state=16,
            mamba_chunk_size=32,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.25,
            logits_scaling=2.0,
            max_position_embeddings=MAX_TOTAL_TOKENS,
            initializer_range=0.2,
        )
        return GraniteMoeHybridForCausalLM(config)

    return build


def nemotron_h(tokens: dict[str, int]) -> PreTrainedModel:
    config = NemotronHConfig(
        **tokens,
        hidden_size=64,
        intermediate_size=96,
        # A Mamba-2 layer, an expert block, attention without rotary, a Mamba-2 layer and a relu² MLP block.
        hybrid_override_pattern="ME*M-",
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=32,
        n_groups=2,
        ssm_state_size=16,
        chunk_size=32,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
    )
    return NemotronHForCausalLM(config)


FAMILIES: dict[str, ModelBuilder] = {
    "qwen3_5": gated_delta_net(Qwen3_5TextConfig, Qwen3_5ForCausalLM),
    "qwen3_next": gated_delta_net(Qwen3NextConfig, Qwen3NextForCausalLM, **EXPERTS),
    "granite-hybrid": granite_hybrid(groups=2),
    "granite-hybrid-one-group": granite_hybrid(groups=1),
    "nemotron-h": nemotron_h,
}


def write_random_hybrid(family: str, model_dir: Path) -> Path:
    """The random checkpoint of `family` in `model_dir`, with the embedded model's tokenizer beside it."""
    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    tokens = {name: embedded_config[name] for name in ("vocab_size", "bos_token_id", "eos_token_id")}
    torch.manual_seed(0)
    model = FAMILIES[family]({**tokens, "pad_token_id": 0})
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Their inits are constant or in head order; routers start at zero.
            if name.endswith(("dt_bias", ".D", "router.weight")):
                param.copy_(torch.randn_like(param))
    model.save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


def serving_flags(model_dir: Path) -> tuple[str, ...]:
    """Float32, eager, with prefill chunks of `PREFILL_CHUNK` tokens and room for `MAX_BATCH_SIZE` requests."""
    return (
        "--model-id", str(model_dir), *FLOAT32_EAGER,
        "--kv-cache-memory", str(8 * 1024 * 1024),
        "--max-batch-size", str(MAX_BATCH_SIZE),
        "--max-batch-prefill-tokens", str(PREFILL_CHUNK),
        "--max-input-tokens", str(MAX_TOTAL_TOKENS // 2),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
    )  # fmt: skip
