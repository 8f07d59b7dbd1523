"""GLM-4.5 and DeepSeek-V3 match transformers over the paged cache: logits of mixed steps and greedy tokens, with
grouped sigmoid routing whose correction bias and group mask change which experts are chosen, shared experts, dense
first layers and (DeepSeek-V3) multi-head latent attention with and without a compressed query, with YaRN."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits
from safetensors.torch import save_file
from shard_testing import load_tiny_model, randomize_correction_biases, write_tiny_checkpoint
from tandem_server.errors import ConfigError
from tandem_server.layers.moe.routing import GroupedTopKRouter
from tandem_server.models import deepseek_v3, glm4_moe
from tandem_server.models.config import read_checkpoint_config
from tandem_server.quant.checks import check_expert_weights
from tandem_server.quant.mode import QuantizeMode
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
)

GROUPED_ROUTING = {
    "n_routed_experts": 8,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 24,
    "routed_scaling_factor": 2.5,
}
# MLA's sizes all differ, so a mixed-up dimension cannot pass.
LATENT_ATTENTION = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 12,
    "qk_rope_head_dim": 8,
    "v_head_dim": 10,
    "n_shared_experts": 1,
}
FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    # Two shared experts, q/k norms and biases, one dense layer before two sparse ones, renormalised weights.
    "glm4-moe-grouped": (
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        {
            **GROUPED_ROUTING,
            "num_hidden_layers": 3,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
            "use_qk_norm": True,
            "attention_bias": True,
        },
    ),
    # Weights left as the scores are (norm_topk_prob off), a quarter of each head rotating, two dense layers.
    "glm4-moe-unnormalised": (
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        {
            **GROUPED_ROUTING,
            "num_hidden_layers": 3,
            "n_shared_experts": 1,
            "first_k_dense_replace": 2,
            "norm_topk_prob": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        },
    ),
    # A compressed query, interleaved rotary pairs, a dense first layer.
    "deepseek-v3-mla": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        {**GROUPED_ROUTING, **LATENT_ATTENTION, "num_hidden_layers": 3, "q_lora_rank": 32, "first_k_dense_replace": 1},
    ),
    # Queries straight from q_proj (Kimi K2 keeps q_lora_rank; DeepSeek-V2-Lite's form), rotate-half pairs, YaRN of
    # factor 4 whose mscale_all_dim changes the softmax scale, unnormalised weights, two dense layers.
    "deepseek-v3-mla-yarn": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        {
            **GROUPED_ROUTING,
            **LATENT_ATTENTION,
            "num_hidden_layers": 3,
            "q_lora_rank": None,
            "first_k_dense_replace": 2,
            "norm_topk_prob": False,
            "rope_interleave": False,
            "attention_bias": True,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        },
    ),
}


def write_family(path: Path, family: str) -> torch.nn.Module:
    config_class, model_class, overrides = FAMILIES[family]
    return write_tiny_checkpoint(path, config_class, model_class, randomize=randomize_correction_biases, **overrides)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    assert_mixed_steps_match_logits(tmp_path, reference, family)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    assert_greedy_matches_generate(tmp_path, reference, family, eos_token_id=2)


@pytest.mark.parametrize("family", ["glm4-moe-grouped", "deepseek-v3-mla"])
def test_bfloat16_steps_stay_within_the_references_own_bfloat16_error(tmp_path: Path, family: str) -> None:
    # The routers' weights and correction biases stay float32, as the reference keeps them; the latent cache holds
    # bfloat16 rows.
    reference = write_family(tmp_path, family)
    routers = [m for m in load_tiny_model(tmp_path, dtype=torch.bfloat16).modules() if isinstance(m, GroupedTopKRouter)]
    assert routers
    assert all(p.dtype == torch.float32 for router in routers for p in router.parameters())
    assert_mixed_steps_match_logits(tmp_path, reference, f"{family} bfloat16", Target(dtype=torch.bfloat16))


def _plain_top_k(router: GroupedTopKRouter, hidden: torch.Tensor, biased: bool) -> list[tuple[int, ...]]:
    scores = torch.sigmoid(hidden.float() @ router.weight.T)
    if biased:
        scores = scores + router.e_score_correction_bias
    return [tuple(sorted(row)) for row in scores.topk(router.config.top_k, dim=-1)[1].tolist()]


def _differing(first: list[tuple[int, ...]], second: list[tuple[int, ...]]) -> int:
    return sum(a != b for a, b in zip(first, second, strict=True))


def test_the_correction_bias_and_the_group_mask_each_change_the_chosen_experts(tmp_path: Path) -> None:
    # The reference checks above can only catch a router that ignores the bias or the groups if these models route
    # differently with them: here, on random hidden states, both change the choice of many tokens.
    write_family(tmp_path, "glm4-moe-grouped")
    model = load_tiny_model(tmp_path)
    router = next(module for module in model.modules() if isinstance(module, GroupedTopKRouter))
    hidden = torch.randn(256, router.weight.shape[1])
    chosen = [tuple(sorted(row)) for row in router.route(hidden).experts.tolist()]
    # A quarter of the tokens or more choose differently without either.
    assert _differing(chosen, _plain_top_k(router, hidden, biased=False)) > 64
    assert _differing(chosen, _plain_top_k(router, hidden, biased=True)) > 64


def test_multi_token_prediction_layers_in_the_checkpoint_are_not_loaded(tmp_path: Path) -> None:
    # Published GLM-4.5 and DeepSeek-V3 checkpoints append `num_nextn_predict_layers` prediction layers after the
    # decoder's, numbered on from it; serving never runs them.
    reference = write_family(tmp_path, "glm4-moe-grouped")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    state = {name: tensor.contiguous() for name, tensor in reference.state_dict().items()}
    state["model.layers.3.eh_proj.weight"] = torch.randn(64, 128)
    state["model.layers.3.mlp.experts.0.up_proj.weight"] = torch.randn(24, 64)
    save_file(state, str(tmp_path / "model.safetensors"))
    assert_mixed_steps_match_logits(tmp_path, reference, "glm4-moe with a prediction layer")


@pytest.mark.parametrize(
    ("defaults", "config_class"),
    [(glm4_moe.CONFIG_DEFAULTS, Glm4MoeConfig), (deepseek_v3.CONFIG_DEFAULTS, DeepseekV3Config)],
)
def test_options_config_json_leaves_out_take_transformers_defaults(
    defaults: dict[str, Any], config_class: type
) -> None:
    written = config_class().to_dict()
    rope = written.get("rope_parameters") or {}
    assert {key: written.get(key, rope.get(key)) for key in defaults} == defaults


def test_quantized_weights_are_refused_for_grouped_moe_models_as_for_every_moe_family(tmp_path: Path) -> None:
    # config.json spells their expert count `n_routed_experts`; read as 0, the check would let --quantize through.
    write_family(tmp_path, "deepseek-v3-mla")
    checkpoint = read_checkpoint_config(tmp_path)
    assert checkpoint.num_experts == 8
    with pytest.raises(ConfigError, match="mixture-of-experts model"):
        check_expert_weights(QuantizeMode.INT8, checkpoint, torch.device("cpu"))
