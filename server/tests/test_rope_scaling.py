"""Rope scaling: each type's cos/sin table equals transformers' rotary embedding, position for position."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from reference_checks import ReferenceLogits, assert_greedy_matches_generate, assert_mixed_steps_match_logits
from shard_testing import write_tiny_checkpoint
from tandem_server.errors import ConfigError
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryEmbedding
from tandem_server.models.phi3 import phi3_args
from transformers import (
    DynamicCache,
    Gemma4TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PretrainedConfig,
)
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

HEAD_DIM = 16
POSITIONS = 64
ORIGINAL = 16
SIZES: dict[str, Any] = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": HEAD_DIM}
SHORT_FACTORS = [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)]
LONG_FACTORS = [1.5 + 0.3 * i for i in range(HEAD_DIM // 2)]
# transformers' forward passes as generation runs them: a prompt that fills the original context, then one token
# at a time past it.
PROMPT_THEN_DECODES = [(0, ORIGINAL)] + [(p, p + 1) for p in range(ORIGINAL, POSITIONS)]


def reference_tables(rotary: torch.nn.Module, passes: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos and sin (one value per pair) for positions [0, POSITIONS), forward pass by forward pass."""
    cos, sin = [], []
    for start, end in passes:
        pass_cos, pass_sin = rotary(torch.zeros(1), torch.arange(start, end)[None])
        pairs = pass_cos.shape[-1] // 2
        cos.append(pass_cos[0, :, :pairs])
        sin.append(pass_sin[0, :, :pairs])
    return torch.cat(cos), torch.cat(sin)


def assert_tables_equal(config: PretrainedConfig, rotary_class: type, passes: list[tuple[int, int]]) -> RopeConfig:
    rope = RopeConfig.from_hf(config.to_dict())
    ours = RotaryEmbedding(HEAD_DIM, POSITIONS, rope)
    cos, sin = reference_tables(rotary_class(config), passes)
    torch.testing.assert_close(ours.cos, cos, atol=0, rtol=0)
    torch.testing.assert_close(ours.sin, sin, atol=0, rtol=0)
    return rope


@pytest.mark.parametrize(
    "options",
    [
        {"factor": 4.0, "original_max_position_embeddings": ORIGINAL},
        # DeepSeek's mscale pair, gpt-oss' untruncated correction range, narrower betas.
        {
            "factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
            "beta_fast": 8,
            "beta_slow": 2,
            "mscale": 0.7,
            "mscale_all_dim": 1.0,
            "truncate": False,
        },
        {"factor": 2.0, "original_max_position_embeddings": ORIGINAL, "attention_factor": 1.25},
    ],
    ids=["defaults", "mscale-untruncated", "given-attention-factor"],
)
def test_yarn_table_equals_transformers(options: dict[str, Any]) -> None:
    parameters = {"rope_type": "yarn", "rope_theta": 10000.0, **options}
    config = LlamaConfig(**SIZES, max_position_embeddings=POSITIONS, rope_parameters=parameters)
    rope = assert_tables_equal(config, LlamaRotaryEmbedding, [(0, POSITIONS)])
    assert rope.attention_factor != 1.0


@pytest.mark.parametrize(
    "options",
    [{"partial_rotary_factor": 0.25}, {"partial_rotary_factor": 0.5, "factor": 2.0}],
    ids=["quarter", "half-scaled"],
)
def test_proportional_table_equals_transformers_gemma4_global_layers(options: dict[str, Any]) -> None:
    # The rotating pairs span both halves of the whole head, their frequencies spaced over the whole head; the rest
    # turn by zero.
    parameters = {
        "full_attention": {"rope_type": "proportional", "rope_theta": 10000.0, **options},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    }
    config = Gemma4TextConfig(
        **SIZES, global_head_dim=HEAD_DIM, num_hidden_layers=2, rope_parameters=parameters, max_position_embeddings=64
    )
    rope = RopeConfig.from_hf({"rope_parameters": parameters["full_attention"]})
    ours = RotaryEmbedding(HEAD_DIM, POSITIONS, rope)
    pass_cos, pass_sin = Gemma4TextRotaryEmbedding(config)(
        torch.zeros(1), torch.arange(POSITIONS)[None], "full_attention"
    )
    torch.testing.assert_close(ours.cos, pass_cos[0, :, : HEAD_DIM // 2], atol=0, rtol=0)
    torch.testing.assert_close(ours.sin, pass_sin[0, :, : HEAD_DIM // 2], atol=0, rtol=0)
    rotating = int(options["partial_rotary_factor"] * HEAD_DIM // 2)
    assert torch.all(ours.sin[:, rotating:] == 0) and torch.any(ours.sin[1:, :rotating] != 0)


def test_longrope_takes_short_factors_below_the_original_context_and_long_factors_from_it_on() -> None:
    parameters = {"rope_type": "longrope", "short_factor": SHORT_FACTORS, "long_factor": LONG_FACTORS}
    config = Phi3Config(
        **SIZES,
        max_position_embeddings=POSITIONS,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={**parameters, "rope_theta": 10000.0},
    )
    rope = assert_tables_equal(config, Phi3RotaryEmbedding, PROMPT_THEN_DECODES)
    # Both halves carry transformers' attention factor for a 4x context: sqrt(1 + ln 4 / ln 16).
    assert rope.attention_factor == pytest.approx(1.5**0.5)


def test_dynamic_base_grows_per_position_as_transformers_grows_it_decoding() -> None:
    parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    config = LlamaConfig(**SIZES, max_position_embeddings=ORIGINAL, rope_parameters=parameters)
    assert_tables_equal(config, LlamaRotaryEmbedding, PROMPT_THEN_DECODES)


def test_phi35_and_phi4_mini_longrope_configs_load() -> None:
    phi35 = {
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.5] * 48},
    }
    rope = phi3_args(phi35).layers[0].rope
    assert (rope.rope_type, rope.original_max_position_embeddings, rope.factor) == ("longrope", 4096, 32.0)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    # Phi-4-mini rotates 3/4 of its 128-dim heads: 48 pairs, one factor each.
    phi4_mini = {**phi35, "hidden_size": 3072, "num_attention_heads": 24, "partial_rotary_factor": 0.75}
    phi4_mini["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
    rope = phi3_args(phi4_mini).layers[0].rope
    table = RotaryEmbedding(128, 4100, rope)
    assert table.cos.shape == (4100, 48)
    with pytest.raises(ConfigError, match="longrope short_factor has 48 values; the heads rotate 64 pairs"):
        RotaryEmbedding(128, 8, RopeConfig.from_hf({**phi4_mini, "partial_rotary_factor": 1.0}))


def test_phi3_su_rope_is_longrope() -> None:
    config = {**SIZES, "vocab_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    config["rope_scaling"] = {"type": "su", "short_factor": SHORT_FACTORS, "long_factor": LONG_FACTORS}
    assert phi3_args(config).layers[0].rope.rope_type == "longrope"


# Decoding past the original context: tables that depend on position.
POSITION_DEPENDENT: dict[str, tuple[type, type, Callable[[int], dict[str, Any]]]] = {
    "phi3-longrope": (
        Phi3Config,
        Phi3ForCausalLM,
        lambda original: {
            "original_max_position_embeddings": original,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": SHORT_FACTORS[:4],
                "long_factor": LONG_FACTORS[:4],
            },
        },
    ),
    "llama-dynamic": (
        LlamaConfig,
        LlamaForCausalLM,
        lambda original: {
            "max_position_embeddings": original,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        },
    ),
}


def decoded_logits(original: int) -> ReferenceLogits:
    """transformers' logits as generation computes them: a prompt within the original context, then one token per
    forward pass (the position-dependent tables follow each pass's length, and its cache keeps earlier keys)."""

    def logits(reference: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        prompt = min(len(ids), original - 1)
        cache = DynamicCache()
        rows = [reference(torch.tensor([ids[:prompt]]), cache=cache, use_cache=True).logits[0]]
        for token in ids[prompt:]:
            rows.append(reference(torch.tensor([[token]]), cache=cache, use_cache=True).logits[0])
        return torch.cat(rows)

    return logits


@pytest.mark.parametrize("family", sorted(POSITION_DEPENDENT))
def test_logits_match_transformers_decoding_past_the_original_context(tmp_path: Path, family: str) -> None:
    config_class, model_class, overrides = POSITION_DEPENDENT[family]
    original = 8
    reference = write_tiny_checkpoint(tmp_path, config_class, model_class, **overrides(original))
    assert_mixed_steps_match_logits(tmp_path, reference, family, reference_logits=decoded_logits(original))


# Phi-3's `generate` recomputes the whole sequence with the long factors once it outgrows the original context; the
# paged cache keeps the short rotation of earlier positions, so Phi-3's generation here stays within its original
# context while dynamic's passes it (the prompts hold up to 14 tokens, the outputs 10 more).
GENERATION_ORIGINAL_CONTEXT = {"phi3-longrope": 32, "llama-dynamic": 16}


@pytest.mark.parametrize("family", sorted(POSITION_DEPENDENT))
def test_greedy_generation_matches_generate(tmp_path: Path, family: str) -> None:
    config_class, model_class, overrides = POSITION_DEPENDENT[family]
    original = GENERATION_ORIGINAL_CONTEXT[family]
    reference = write_tiny_checkpoint(tmp_path, config_class, model_class, **overrides(original))
    assert_greedy_matches_generate(tmp_path, reference, family, eos_token_id=2)
