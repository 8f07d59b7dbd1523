"""Every mixture-of-experts family matches transformers over the paged cache: logits of mixed steps and greedy
tokens, from checkpoints as save_pretrained writes them (one tensor per expert) and as transformers 5 holds them
(stacked `experts.gate_up_proj` and `experts.down_proj`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits
from safetensors.torch import save_file
from shard_testing import write_tiny_checkpoint
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

# Top-k of 1, 2, 3 and 4; odd and even expert counts; dense layers beside sparse ones. A decode row routes to top-k
# experts only, so every decode step leaves experts without a token.
FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    # top-1 over an odd number of experts, with a window shorter than the test sequences.
    "mixtral-top1-odd-sliding": (
        MixtralConfig,
        MixtralForCausalLM,
        {"num_local_experts": 5, "num_experts_per_tok": 1, "intermediate_size": 48, "sliding_window": 6},
    ),
    "mixtral-top2": (MixtralConfig, MixtralForCausalLM, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # A shared expert with its sigmoid gate; the second layer dense (mlp_only_layers).
    "qwen2-moe-shared-dense-layer": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        {
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 40,
            "mlp_only_layers": [1],
        },
    ),
    # top-4 of 7, renormalised; every second layer sparse, the first dense (decoder_sparse_step).
    "qwen3-moe-top4-sparse-step": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        {
            "num_hidden_layers": 3,
            "num_experts": 7,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "decoder_sparse_step": 2,
            "head_dim": 16,
        },
    ),
    "olmoe-top3": (
        OlmoeConfig,
        OlmoeForCausalLM,
        {"num_experts": 5, "num_experts_per_tok": 3, "intermediate_size": 40, "pad_token_id": 0},
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


@pytest.mark.parametrize("family", ["mixtral-top2", "qwen2-moe-shared-dense-layer"])
def test_stacked_expert_checkpoints_load_like_per_expert_ones(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    state = reference.state_dict()
    assert any(name.endswith("experts.gate_up_proj") for name in state)
    (tmp_path / "model.safetensors").unlink()
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(tmp_path / "model.safetensors"))
    assert_mixed_steps_match_logits(tmp_path, reference, family)


@pytest.mark.parametrize("family", ["mixtral-top2", "qwen2-moe-shared-dense-layer"])
def test_bfloat16_steps_stay_within_the_references_own_bfloat16_error(tmp_path: Path, family: str) -> None:
    # bfloat16 is the CPU shard's default dtype where the CPU multiplies it natively.
    reference = write_family(tmp_path, family)
    assert_mixed_steps_match_logits(tmp_path, reference, f"{family} bfloat16", Target(dtype=torch.bfloat16))
