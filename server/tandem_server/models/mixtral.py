"""Mixtral: the Mistral layout with every feed-forward a sparse MoE block (softmax router, top-k renormalised).

Published checkpoints name each expert's projections `block_sparse_moe.experts.{e}.w1/w3/w2` (gate, up, down);
transformers 5 holds them stacked under `mlp.experts`; both load."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.models.moe_config import router_config, stacked_experts, with_sparse_layers
from tandem_server.weights.layout import CheckpointLayout, Renamed

# The published names, rewritten to the per-expert names every MoE family's parameters carry.
PUBLISHED_NAMES = (
    Renamed(r"\.block_sparse_moe\.experts\.(\d+)\.w1\.", r".mlp.experts.\1.gate_proj."),
    Renamed(r"\.block_sparse_moe\.experts\.(\d+)\.w3\.", r".mlp.experts.\1.up_proj."),
    Renamed(r"\.block_sparse_moe\.experts\.(\d+)\.w2\.", r".mlp.experts.\1.down_proj."),
    Renamed(r"\.block_sparse_moe\.gate\.", ".mlp.gate."),
)


def mixtral_args(hf: dict[str, Any]) -> DecoderArgs:
    """Mixtral's options: every layer sparse, each expert `intermediate_size` wide, a configured `sliding_window`
    on every layer."""
    num_layers = int(hf["num_hidden_layers"])
    window = hf.get("sliding_window")
    layers = uniform_layers(hf, (int(window),) * num_layers if window else None)
    sizes = common_sizes(hf)
    return DecoderArgs(
        **sizes,
        layers=with_sparse_layers(layers, (True,) * num_layers),
        moe=MoeArgs(router_config(hf, normalize_top_k=True), sizes["intermediate_size"]),
        layout=CheckpointLayout(renamed=PUBLISHED_NAMES, expert_stacks=stacked_experts(hf)),
    )


class MixtralForCausalLM(DecoderForCausalLM):
    """Pre-norm decoder whose feed-forwards are sparse mixtures of SwiGLU experts."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(mixtral_args(hf_config), parallel, backend)
