"""Reads an FP8 checkpoint's `quantization_config` (config.json) in the layouts published on the Hub; torch-free.

- compressed-tensors (`float-quantized`, `naive-quantized`): each quantized linear layer has `weight` in float8 e4m3
  and `weight_scale` (per tensor: shape `[1]` or `[]`; per channel: `[out, 1]`); static activations add a per-tensor
  `input_scale`. Layers the `ignore` list names stay float.
- FBGEMM FP8 (`fbgemm_fp8`): `weight` in float8 e4m3 and a per-channel `weight_scale` `[out, 1]`; activations are
  scaled per token, each token's largest magnitude capped at `activation_scale_ub`. Layers in
  `modules_to_not_convert` stay float.
- `fp8` (AutoFP8, and transformers' FineGrainedFP8 as DeepSeek-V3 and Qwen3 FP8 checkpoints use it): without
  `weight_block_size`, `weight` in float8 e4m3 with a per-tensor `weight_scale` and, when `activation_scheme` is
  static, a per-tensor `input_scale`; with `weight_block_size` `[rows, inputs]`, a `weight_scale_inv` per block
  (`w = q * scale` despite the name) and activations scaled per token and run of `inputs` features (dynamic only).
  Layers in `ignored_layers` (or `modules_to_not_convert`) stay float.
Whichever the layout, a layer is float8 exactly when its `weight` tensor is, so the loader decides layer by layer;
this module only checks that every declared scheme is one Tandem serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError

FP8_METHODS = ("compressed-tensors", "fbgemm_fp8", "fp8")
COMPRESSED_TENSORS_FORMATS = ("float-quantized", "naive-quantized")
# FBGEMM's default bound on an activation's largest magnitude (transformers' FbgemmFp8Config).
DEFAULT_ACTIVATION_SCALE_UB = 1200.0
_SUPPORTED = (
    "Tandem serves FP8 checkpoints: compressed-tensors float8 weights (8-bit float, per-tensor or per-channel scales, "
    "symmetric), fbgemm_fp8, and fp8 (AutoFP8 per-tensor; block-wise with dynamic activations)"
)
ACTIVATION_SCHEMES = ("static", "dynamic")


@dataclass(frozen=True)
class Fp8Scheme:
    """How an FP8 checkpoint's activations are scaled: static per-tensor `input_scale`s, or per token (capped at
    `activation_bound` when set; per token and block of inputs when `weight_block` is set)."""

    method: str
    static_activations: bool = False
    activation_bound: float | None = None
    # `weight_block_size` (rows, input features) of a block-wise checkpoint; None: per-tensor or per-channel scales.
    weight_block: tuple[int, int] | None = None


def checkpoint_fp8_scheme(hf: dict[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme config.json declares, None for a float checkpoint; any other quantization is refused."""
    config = hf.get("quantization_config")
    if config is None:
        return None
    method = config.get("quant_method")
    if method == "fbgemm_fp8":
        return Fp8Scheme(method, activation_bound=float(config.get("activation_scale_ub", DEFAULT_ACTIVATION_SCALE_UB)))
    if method == "compressed-tensors":
        return _compressed_tensors(config)
    if method == "fp8":
        return _fp8(config)
    raise ConfigError(
        f"quantization_config: quant_method {method!r} is not supported; Tandem serves FP8 checkpoints "
        "(compressed-tensors, fbgemm_fp8, fp8), int4 ones (gptq, awq) and gpt-oss's MXFP4 experts (mxfp4)"
    )


def _fp8(config: dict[str, Any]) -> Fp8Scheme:
    """AutoFP8's per-tensor layout, or transformers' block-wise one when `weight_block_size` is set."""
    activation_scheme = config.get("activation_scheme", "dynamic")
    if activation_scheme not in ACTIVATION_SCHEMES:
        raise ConfigError(
            f"fp8 quantization_config: activation_scheme {activation_scheme!r} is not supported "
            f"(supported: {', '.join(ACTIVATION_SCHEMES)})"
        )
    value_format = config.get("fmt", "e4m3")
    if value_format != "e4m3":
        raise ConfigError(f"fp8 quantization_config: fmt {value_format!r} is not supported (float8 e4m3 only)")
    scale_format = config.get("scale_fmt", "float")
    if scale_format != "float":
        raise ConfigError(
            f"fp8 quantization_config: scale_fmt {scale_format!r} (power-of-two scales) is not supported; "
            "Tandem reads float32 weight_scale_inv"
        )
    if config.get("kv_cache_quant_targets"):
        raise ConfigError(
            "fp8 quantization_config: kv_cache_quant_targets (a quantized KV cache with stored scales) is not "
            "supported; Tandem's KV cache dtype is --kv-cache-dtype"
        )
    static = activation_scheme == "static"
    block = config.get("weight_block_size")
    if block is None:
        return Fp8Scheme("fp8", static_activations=static)
    if not isinstance(block, list | tuple) or len(block) != 2 or not all(isinstance(n, int) and n > 0 for n in block):
        raise ConfigError(f"fp8 quantization_config: weight_block_size {block!r} is not two positive integers")
    if static:
        raise ConfigError(
            f"fp8 quantization_config: weight_block_size {list(block)} with static activations is not supported; "
            "block-wise checkpoints are served with activations scaled per token and block (activation_scheme dynamic)"
        )
    return Fp8Scheme("fp8", weight_block=(block[0], block[1]))


def _compressed_tensors(config: dict[str, Any]) -> Fp8Scheme:
    groups = config.get("config_groups") or {}
    if not groups:
        raise ConfigError("compressed-tensors quantization_config has no config_groups")
    sparsity = (config.get("sparsity_config") or {}).get("format", "dense")
    if sparsity != "dense":
        raise ConfigError(f"compressed-tensors sparsity_config format {sparsity!r} (sparse weights) is not supported")
    if config.get("kv_cache_scheme"):
        raise ConfigError(
            "compressed-tensors kv_cache_scheme (a quantized KV cache with stored scales) is not supported; "
            "Tandem's KV cache dtype is --kv-cache-dtype"
        )
    static = set()
    for name, group in groups.items():
        group_format = group.get("format") or config.get("format")
        if group_format not in COMPRESSED_TENSORS_FORMATS:
            raise ConfigError(
                f"compressed-tensors group {name!r}: format {group_format!r} is not supported "
                f"(supported: {', '.join(COMPRESSED_TENSORS_FORMATS)}); {_SUPPORTED}"
            )
        _check_weights(name, group.get("weights") or {})
        static.add(_static_activations(name, group.get("input_activations")))
    if len(static) > 1:
        raise ConfigError("compressed-tensors groups mix static and dynamic activation scales; not supported")
    return Fp8Scheme("compressed-tensors", static_activations=static.pop())


def _describe(args: dict[str, Any]) -> str:
    group = f", group_size {args['group_size']}" if args.get("group_size") else ""
    return f"{args.get('type')} {args.get('num_bits')}-bit, strategy {args.get('strategy')}{group}"


def _check_weights(name: str, weights: dict[str, Any]) -> None:
    supported = (
        weights.get("type") == "float"
        and weights.get("num_bits") == 8
        and weights.get("strategy") in ("tensor", "channel")
        and weights.get("symmetric", True)
        and not weights.get("block_structure")
    )
    if not supported:
        raise ConfigError(
            f"compressed-tensors group {name!r}: weights {_describe(weights)} are not supported; {_SUPPORTED}"
        )


def _static_activations(name: str, activations: dict[str, Any] | None) -> bool:
    """Whether the group's activations have static per-tensor scales (None: weight-only, scaled per token here)."""
    if activations is None:
        return False
    dynamic = activations.get("dynamic", False)
    strategy = activations.get("strategy")
    supported = (
        activations.get("type") == "float"
        and activations.get("num_bits") == 8
        and activations.get("symmetric", True)
        and (strategy == "tensor" or (dynamic and strategy == "token"))
    )
    if not supported:
        raise ConfigError(
            f"compressed-tensors group {name!r}: input activations {_describe(activations)} "
            f"({'dynamic' if dynamic else 'static'}) are not supported; {_SUPPORTED}"
        )
    return not dynamic
