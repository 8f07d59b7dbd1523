"""gpt-oss (gpt-oss-20b, gpt-oss-120b): sliding-window and full-attention layers alternating per `layer_types`,
attention with biases and a learned sink per head, YaRN rotary, and every feed-forward a sparse MoE block whose router
has a bias and softmaxes its top-k logits, and whose experts have biases around a clamped SwiGLU.

The published checkpoints hold the experts' weights as MXFP4 blocks (`quantization_config.quant_method: mxfp4`), kept
packed; bfloat16 ones (transformers' own layout) load as float."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    common_sizes,
    uniform_layers,
    windows_from_layer_types,
)
from tandem_server.models.moe_config import router_config, with_sparse_layers
from tandem_server.quant.mxfp4.format import is_mxfp4
from tandem_server.weights.layout import CheckpointLayout, Renamed

# transformers' defaults for configs that leave them out.
DEFAULT_SWIGLU_ALPHA = 1.702
DEFAULT_SWIGLU_LIMIT = 7.0
DEFAULT_SLIDING_WINDOW = 128

# The router's checkpoint name, rewritten to the MoE block's.
PUBLISHED_NAMES = (Renamed(r"\.mlp\.router\.", ".mlp.gate."),)


def gpt_oss_args(hf: dict[str, Any]) -> DecoderArgs:
    """gpt-oss's options: `attention_bias` (default on) on all four projections, `num_local_experts` experts each
    `intermediate_size` wide, `swiglu_alpha` and `swiglu_limit`, MXFP4 experts per `quantization_config`."""
    num_layers = int(hf["num_hidden_layers"])
    attention_bias = bool(hf.get("attention_bias", True))
    glu = ClampedSwiGLU(
        alpha=float(hf.get("swiglu_alpha") or DEFAULT_SWIGLU_ALPHA),
        limit=float(hf.get("swiglu_limit") or DEFAULT_SWIGLU_LIMIT),
    )
    sizes = common_sizes(hf)
    moe = MoeArgs(
        router_config(hf),
        sizes["intermediate_size"],
        router_over_top_logits=True,
        clamped_swiglu=glu,
        mxfp4=is_mxfp4(hf.get("quantization_config") or {}),
    )
    return DecoderArgs(
        **sizes,
        layers=with_sparse_layers(uniform_layers(hf, _windows(hf)), (True,) * num_layers),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        attention_sinks=True,
        moe=moe,
        layout=CheckpointLayout(renamed=PUBLISHED_NAMES),
    )


def _windows(hf: dict[str, Any]) -> tuple[int | None, ...]:
    """Per `layer_types`; without it transformers' default, sliding layers first and full ones every second."""
    windows = windows_from_layer_types(hf)
    if windows is not None:
        return windows
    window = int(hf.get("sliding_window") or DEFAULT_SLIDING_WINDOW)
    return tuple(window if layer % 2 == 0 else None for layer in range(int(hf["num_hidden_layers"])))


class GptOssForCausalLM(DecoderForCausalLM):
    """Pre-norm decoder with attention sinks and sparse mixtures of biased clamped-SwiGLU experts."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(gpt_oss_args(hf_config), parallel, backend)
