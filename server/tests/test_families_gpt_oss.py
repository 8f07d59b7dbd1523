"""gpt-oss matches transformers over the paged cache: logits of mixed steps and greedy tokens, from float checkpoints
(transformers' layout) and MXFP4 ones (as published, the experts kept packed); its attention sinks count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gpt_oss_testing import write_gpt_oss, write_gpt_oss_mxfp4
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits
from safetensors.torch import load_file, save_file
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.bootstrap import choose_attention_backend
from tandem_server.config import ShardConfig
from tandem_server.errors import ConfigError
from tandem_server.layers.moe.mxfp4_experts import Mxfp4SwiGLUExperts
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU, ClampedSwiGLUExperts
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.gpt_oss import gpt_oss_args
from tandem_server.models.parameter_counts import parameter_counts

WRITERS = {"float": write_gpt_oss, "mxfp4": write_gpt_oss_mxfp4}


@pytest.mark.parametrize("weights", WRITERS)
def test_mixed_steps_match_transformers_logits(tmp_path: Path, weights: str) -> None:
    reference = WRITERS[weights](tmp_path)
    assert_mixed_steps_match_logits(tmp_path, reference, f"gpt-oss {weights}")


@pytest.mark.parametrize("weights", WRITERS)
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, weights: str) -> None:
    reference = WRITERS[weights](tmp_path)
    assert_greedy_matches_generate(tmp_path, reference, f"gpt-oss {weights}", eos_token_id=2)


def test_the_logits_depend_on_the_attention_sinks(tmp_path: Path) -> None:
    # The same checkpoint with every sink zeroed no longer matches the reference: a model that ignored its sinks
    # could not pass the tests above.
    reference = write_gpt_oss(tmp_path / "sinks")
    zeroed = tmp_path / "zeroed"
    shutil.copytree(tmp_path / "sinks", zeroed)
    tensors = load_file(str(zeroed / "model.safetensors"))
    sinks = [name for name in tensors if name.endswith("self_attn.sinks")]
    assert len(sinks) == 3
    save_file(
        {name: torch.zeros_like(t) if name in sinks else t for name, t in tensors.items()}, zeroed / "model.safetensors"
    )
    with pytest.raises(AssertionError, match="logit error"):
        assert_mixed_steps_match_logits(zeroed, reference, "gpt-oss without sinks")


def test_a_backend_that_cannot_add_sinks_stops_start_up_naming_them(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    checkpoint = read_checkpoint_config(tmp_path)
    config = ShardConfig(model_path=tmp_path, uds_path=tmp_path / "shard.sock", attention_backend="sdpa")
    with pytest.raises(ConfigError, match="--attention-backend sdpa is unavailable: torch SDPA cannot add attention"):
        choose_attention_backend(config, checkpoint, decode_mirror_memory=0)
    auto = ShardConfig(model_path=tmp_path, uds_path=tmp_path / "shard.sock")
    assert choose_attention_backend(auto, checkpoint, decode_mirror_memory=0).name == "torch"


def test_bfloat16_mxfp4_steps_stay_within_the_references_own_bfloat16_error(tmp_path: Path) -> None:
    reference = write_gpt_oss_mxfp4(tmp_path)
    assert_mixed_steps_match_logits(tmp_path, reference, "gpt-oss mxfp4 bfloat16", Target(dtype=torch.bfloat16))


def test_mxfp4_experts_stay_packed_and_count_the_weights_they_hold(tmp_path: Path) -> None:
    write_gpt_oss(tmp_path / "float")
    write_gpt_oss_mxfp4(tmp_path / "mxfp4")
    packed = load_tiny_model(tmp_path / "mxfp4")
    experts = [module for module in packed.modules() if isinstance(module, ClampedSwiGLUExperts)]
    assert len(experts) == 3 and all(isinstance(module, Mxfp4SwiGLUExperts) for module in experts)
    weights = {name: param for name, param in experts[0].named_parameters() if not name.endswith("bias")}
    assert {name: param.dtype for name, param in weights.items()} == dict.fromkeys(
        ["gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"], torch.uint8
    )
    # 5 experts x (2 x 64 gate/up rows + 64 down rows) x 64 columns: 4 bits per weight, 8 per 32-weight scale.
    assert sum(param.numel() for param in weights.values()) == 5 * 3 * 64 * (64 // 2 + 64 // 32)
    assert parameter_counts(packed) == parameter_counts(load_tiny_model(tmp_path / "float"))


def declare_mxfp4(checkpoint: Path) -> None:
    """Makes `checkpoint`'s config.json declare MXFP4 weights."""
    config = checkpoint / "config.json"
    hf = json.loads(config.read_text())
    config.write_text(json.dumps({**hf, "quantization_config": {"quant_method": "mxfp4"}}))


def test_mxfp4_intermediate_sizes_outside_whole_blocks_are_config_errors(tmp_path: Path) -> None:
    write_gpt_oss(tmp_path, intermediate_size=48)
    declare_mxfp4(tmp_path)
    with pytest.raises(ConfigError, match="intermediate_size 48 is not a multiple of the weights' 32-value blocks"):
        load_tiny_model(tmp_path)


def test_an_mxfp4_checkpoint_of_another_family_is_a_config_error(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    declare_mxfp4(tmp_path)
    with pytest.raises(ConfigError, match="MXFP4 weights are served only as gpt-oss's experts"):
        load_tiny_model(tmp_path)


# gpt-oss-20b's config.json as published (its tokenizer's fields aside).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}


def test_the_published_gpt_oss_20b_config_reads_as_published(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    checkpoint = read_checkpoint_config(tmp_path)
    assert (checkpoint.mxfp4, checkpoint.fp8, checkpoint.num_experts) == (True, None, 32)
    args = gpt_oss_args(checkpoint.hf)
    assert [kind.sliding_window for kind in args.layers[:3]] == [128, None, 128]
    assert all(kind.sparse_mlp for kind in args.layers) and args.attention_sinks
    assert (args.qkv_bias, args.o_bias, args.num_kv_heads, args.head_dim) == (True, True, 8, 64)
    rope = args.layers[0].rope
    assert (rope.rope_type, rope.theta, rope.factor, rope.truncate) == ("yarn", 150000.0, 32.0, False)
    assert rope.original_max_position_embeddings == 4096
    moe = args.moe
    assert moe is not None and moe.mxfp4 and moe.router_over_top_logits
    assert (moe.router.num_experts, moe.router.top_k, moe.intermediate_size) == (32, 4, 2880)
    assert moe.clamped_swiglu == ClampedSwiGLU(alpha=1.702, limit=7.0)
