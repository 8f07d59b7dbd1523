"""Family configuration: the registry, per-layer windows and rotary tables, fused tensors, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from shard_testing import write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError, UnsupportedArchitectureError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryEmbedding
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.gemma3 import gemma3_args
from tandem_server.models.glm4 import glm4_args
from tandem_server.models.llama import llama_args
from tandem_server.models.loader import load_model
from tandem_server.models.olmo3 import Olmo3ForCausalLM, olmo3_args
from tandem_server.models.qwen2 import qwen2_args
from tandem_server.models.registry import model_factory
from tandem_server.models.smollm3 import smollm3_args
from transformers import Phi3Config, Phi3ForCausalLM

BASE: dict[str, Any] = {
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}

FAMILIES = [
    "Gemma3ForCausalLM",
    "Glm4ForCausalLM",
    "GraniteForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Olmo3ForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "SmolLM3ForCausalLM",
]


def test_every_family_is_registered_and_unknown_ones_list_them() -> None:
    for architecture in FAMILIES:
        model_factory(architecture)
    with pytest.raises(UnsupportedArchitectureError) as error:
        model_factory("FalconForCausalLM")
    assert all(architecture in str(error.value) for architecture in FAMILIES)


def test_unknown_rope_type_names_it_and_lists_supported() -> None:
    supported = "default, linear, llama3, yarn, longrope, dynamic"
    with pytest.raises(ConfigError, match=rf"unsupported rope scaling 'alibi'; supported: {supported}"):
        llama_args({**BASE, "rope_scaling": {"rope_type": "alibi"}})


def test_multimodal_sections_are_read_as_default_frequencies_and_must_cover_the_rotated_pairs() -> None:
    rope = llama_args({**BASE, "rope_scaling": {"type": "mrope", "mrope_section": [6, 1, 1]}}).layers[0].rope
    assert (rope.rope_type, rope.mrope_section) == ("default", (6, 1, 1))
    RotaryEmbedding(16, 8, rope)
    with pytest.raises(ConfigError, match=r"mrope_section \[6, 1, 1\] adds up to 8 pairs; the heads rotate 16"):
        RotaryEmbedding(32, 8, rope)


@pytest.mark.parametrize(
    ("rope_scaling", "unknown"),
    [
        ({"rope_type": "default", "beta_fast": 32.0}, "'beta_fast'"),
        ({"type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "'low_freq_factor'"),
        ({"rope_type": "yarn", "factor": 4.0, "short_factor": [1.0], "finetuned": True}, "'finetuned', 'short_factor'"),
    ],
)
def test_rope_options_its_type_does_not_read_are_named(rope_scaling: dict[str, Any], unknown: str) -> None:
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    with pytest.raises(ConfigError, match=rf"unsupported {rope_type} rope options \[{unknown}\]; {rope_type} reads: "):
        llama_args({**BASE, "rope_scaling": rope_scaling})


def test_unsupported_activation_names_it_and_lists_supported() -> None:
    with pytest.raises(ConfigError, match=r"unsupported activation 'prelu'; supported: silu, .*gelu_pytorch_tanh"):
        llama_args({**BASE, "hidden_act": "prelu"})


def test_unknown_layer_type_is_rejected() -> None:
    layer_types = ["full_attention", "chunked_attention", "full_attention", "full_attention"]
    with pytest.raises(ConfigError, match=r"unsupported layer types \['chunked_attention'\]"):
        qwen2_args({**BASE, "layer_types": layer_types, "sliding_window": 8})


def test_bidirectional_gemma3_is_rejected() -> None:
    with pytest.raises(ConfigError, match="use_bidirectional_attention"):
        gemma3_args({**BASE, "use_bidirectional_attention": True})


def test_mistral_window_applies_to_every_layer_and_qwen2_only_above_max_window_layers() -> None:
    mistral = llama_args({**BASE, "sliding_window": 8})
    assert [kind.sliding_window for kind in mistral.layers] == [8, 8, 8, 8]
    qwen = qwen2_args({**BASE, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2})
    assert [kind.sliding_window for kind in qwen.layers] == [None, None, 8, 8]
    assert [kind.sliding_window for kind in qwen2_args({**BASE, "sliding_window": 8}).layers] == [None] * 4


def test_gemma3_hub_config_gives_local_layers_their_own_rope_base() -> None:
    hub = {
        **BASE,
        "num_hidden_layers": 6,
        "sliding_window": 512,
        "sliding_window_pattern": 3,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 4,
    }
    args = gemma3_args(hub)
    assert [kind.sliding_window for kind in args.layers] == [512, 512, None, 512, 512, None]
    global_rope = RopeConfig(theta=1_000_000.0, rope_type="linear", factor=8.0)
    assert {kind.rope for kind in args.layers if kind.sliding_window is None} == {global_rope}
    assert {kind.rope for kind in args.layers if kind.sliding_window} == {RopeConfig(theta=10_000.0)}
    assert args.query_scale == 0.5 and args.embedding_scale == 4.0 and args.tie_word_embeddings


def test_phi3_fused_tensors_are_split_before_each_rank_takes_its_heads(tmp_path: Path) -> None:
    reference = write_tiny_checkpoint(tmp_path, Phi3Config, Phi3ForCausalLM, num_key_value_heads=2)
    fused_qkv = reference.model.layers[1].self_attn.qkv_proj.weight.detach()
    fused_gate_up = reference.model.layers[1].mlp.gate_up_proj.weight.detach()
    checkpoint = read_checkpoint_config(tmp_path)
    # 4 query heads and 2 KV heads of 16 dims: rank 1 of 2 holds query heads 2-3 and KV head 1.
    model = load_model(checkpoint, torch.float32, torch.device("cpu"), ParallelContext(1, 2), TorchAttentionBackend())
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    torch.testing.assert_close(attention.q_proj.weight, fused_qkv[32:64], atol=0, rtol=0)
    torch.testing.assert_close(attention.k_proj.weight, fused_qkv[64 + 16 : 64 + 32], atol=0, rtol=0)
    torch.testing.assert_close(attention.v_proj.weight, fused_qkv[96 + 16 : 96 + 32], atol=0, rtol=0)
    torch.testing.assert_close(mlp.gate_proj.weight, fused_gate_up[64:128], atol=0, rtol=0)
    torch.testing.assert_close(mlp.up_proj.weight, fused_gate_up[128 + 64 : 256], atol=0, rtol=0)


def test_smollm3_without_layer_types_makes_every_fourth_layer_nope_and_slides_only_there() -> None:
    hub = {**BASE, "num_hidden_layers": 8, "use_sliding_window": True, "sliding_window": 16}
    args = smollm3_args(hub)
    assert [kind.rope.rotary_dim(8) for kind in args.layers] == [8, 8, 8, 0] * 2
    assert [kind.sliding_window for kind in args.layers] == [None, None, None, 16] * 2
    assert args.layers[0].rope.theta == 2_000_000.0 and args.tie_word_embeddings
    with pytest.raises(ConfigError, match="no_rope_layers lists 3 layers, num_hidden_layers is 4"):
        smollm3_args({**BASE, "no_rope_layers": [1, 1, 0]})


def test_olmo3_hub_config_scales_only_full_attention_layers_and_slides_three_in_four() -> None:
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "attention_factor": 1.2}
    hub = {**BASE, "max_position_embeddings": 65536, "rope_theta": 500_000.0, "rope_scaling": yarn}
    args = olmo3_args(hub)
    assert [kind.sliding_window for kind in args.layers] == [4096, 4096, 4096, None]
    assert [kind.rope.rope_type for kind in args.layers] == ["default"] * 3 + ["yarn"]
    assert {kind.rope.theta for kind in args.layers} == {500_000.0}
    assert args.layers[3].rope.attention_factor == 1.2


def test_olmo3_refuses_tensor_parallelism_naming_its_full_width_norms() -> None:
    with pytest.raises(ConfigError, match=r"normalises queries and keys over all heads at once.*this group has 2"):
        Olmo3ForCausalLM(BASE, ParallelContext(0, 2), TorchAttentionBackend())


def test_glm4_hub_config_rotates_half_of_each_head_in_interleaved_pairs() -> None:
    args = glm4_args({**BASE, "head_dim": 8})
    assert {(kind.rope.rotary_dim(8), kind.rope.interleaved) for kind in args.layers} == {(4, True)}
    assert args.qkv_bias and not args.o_bias
