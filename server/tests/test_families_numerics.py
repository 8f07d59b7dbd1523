"""Every supported family matches transformers over the paged cache: logits of mixed steps and greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from reference_checks import assert_greedy_matches_generate, assert_mixed_steps_match_logits
from shard_testing import write_tiny_checkpoint
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Glm4Config,
    Glm4ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

# Windows are shorter than the test sequences (up to 24 positions), so they change every later token.
WINDOW = 4
# A pretraining context the test sequences run past, so that scaled rotary tables matter.
ORIGINAL_CONTEXT = 8

FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "qwen2-tied-sliding-upper-layers": (
        Qwen2Config,
        Qwen2ForCausalLM,
        {
            "num_hidden_layers": 3,
            "tie_word_embeddings": True,
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
        },
    ),
    "qwen3-untied": (
        Qwen3Config,
        Qwen3ForCausalLM,
        {"head_dim": 24, "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}},
    ),
    # transformers' Gemma 3 ignores attn_logit_softcapping, so attention soft-capping is checked in the backend test.
    "gemma3-local-global-softcap": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "num_key_value_heads": 1,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
            "final_logit_softcapping": 3.0,
        },
    ),
    "gemma3-untied-pattern": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "num_hidden_layers": 2,
            "head_dim": 16,
            "sliding_window": WINDOW + 1,
            "sliding_window_pattern": 2,
            "tie_word_embeddings": False,
        },
    ),
    "phi3-partial-rotary-sliding": (
        Phi3Config,
        Phi3ForCausalLM,
        {"sliding_window": WINDOW, "partial_rotary_factor": 0.5, "tie_word_embeddings": False},
    ),
    "llama-yarn": (
        LlamaConfig,
        LlamaForCausalLM,
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": ORIGINAL_CONTEXT,
                "beta_fast": 4.0,
            }
        },
    ),
    "smollm3-nope-every-second-layer": (
        SmolLM3Config,
        SmolLM3ForCausalLM,
        {"no_rope_layer_interval": 2, "tie_word_embeddings": True},
    ),
    "smollm3-nope-list-sliding-yarn": (
        SmolLM3Config,
        SmolLM3ForCausalLM,
        {
            "num_hidden_layers": 3,
            "no_rope_layers": [1, 0, 1],
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": ORIGINAL_CONTEXT,
            },
        },
    ),
    "granite-multipliers": (
        GraniteConfig,
        GraniteForCausalLM,
        {
            "embedding_multiplier": 3.0,
            "residual_multiplier": 0.4,
            "attention_multiplier": 0.2,
            "logits_scaling": 2.5,
            "attention_bias": True,
        },
    ),
    "glm4-interleaved-partial-rotary": (Glm4Config, Glm4ForCausalLM, {"head_dim": 16, "num_key_value_heads": 1}),
    "olmo3-full-width-qk-norm-sliding-yarn": (
        Olmo3Config,
        Olmo3ForCausalLM,
        {
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": WINDOW,
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": ORIGINAL_CONTEXT,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
        },
    ),
    "mistral-sliding": (
        MistralConfig,
        MistralForCausalLM,
        {"sliding_window": WINDOW, "head_dim": 8, "tie_word_embeddings": False},
    ),
}


def write_family(path: Path, family: str) -> torch.nn.Module:
    config_class, model_class, overrides = FAMILIES[family]
    return write_tiny_checkpoint(path, config_class, model_class, **overrides)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    assert_mixed_steps_match_logits(tmp_path, reference, family)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    assert_greedy_matches_generate(tmp_path, reference, family, eos_token_id=2)
