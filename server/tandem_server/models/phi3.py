"""Phi-3: the Llama layout stored with fused `qkv_proj` and `gate_up_proj` tensors, split at load time."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.weights.layout import CheckpointLayout, FusedTensor

LONGROPE_ALIASES = ("su", "yarn")


def phi3_args(hf: dict[str, Any]) -> DecoderArgs:
    """Phi-3's sizes; a configured `sliding_window` applies to every layer."""
    sizes = common_sizes(hf)
    q_rows = sizes["num_heads"] * sizes["head_dim"]
    kv_rows = sizes["num_kv_heads"] * sizes["head_dim"]
    layout = CheckpointLayout(
        fused=(
            FusedTensor(
                "self_attn.qkv_proj.weight",
                (
                    ("self_attn.q_proj.weight", q_rows),
                    ("self_attn.k_proj.weight", kv_rows),
                    ("self_attn.v_proj.weight", kv_rows),
                ),
            ),
            FusedTensor(
                "mlp.gate_up_proj.weight",
                (
                    ("mlp.gate_proj.weight", sizes["intermediate_size"]),
                    ("mlp.up_proj.weight", sizes["intermediate_size"]),
                ),
            ),
        )
    )
    window = hf.get("sliding_window")
    windows = (int(window),) * int(hf["num_hidden_layers"]) if window else None
    return DecoderArgs(**sizes, layers=uniform_layers(_longrope_spelled_out(hf), windows), layout=layout)


def _longrope_spelled_out(hf: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's config reads its older names of longrope (`su`, and `yarn` in some 128k checkpoints) as longrope."""
    spelled = dict(hf)
    for key in ("rope_scaling", "rope_parameters"):
        params = hf.get(key) or {}
        if params.get("rope_type", params.get("type")) in LONGROPE_ALIASES:
            spelled[key] = {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}
    return spelled


class Phi3ForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder whose checkpoint fuses q/k/v and gate/up."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(phi3_args(hf_config), parallel, backend)
