"""Gathers an FP8 checkpoint's float8 weights and their scale tensors per parameter, each rank its slice.

A float8 weight is sliced like any weight. A per-channel `weight_scale` follows the weight's rows: a column-parallel
layer reads the rows it keeps, a row-parallel one (split along the inputs) keeps every row's scale; a fused tensor's
scales split with its rows. A per-tensor scale is replicated (to every rank and every part of a fused tensor), and
becomes per channel. A block-wise `weight_scale_inv` is widened to one scale per row and run of inputs
(`blocks`). Scales are checked against their weights once everything is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tandem_server.quant.fp8.blocks import block_window, check_block_count, row_scales
from tandem_server.quant.fp8.scheme import Fp8Scheme
from tandem_server.quant.values import FP8_DTYPE, Fp8Channels
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor

WEIGHT_SCALE = "weight_scale"
# A block-wise checkpoint's scales, one per block of `weight_block_size` (multiplied, despite the name).
WEIGHT_SCALE_INV = "weight_scale_inv"
INPUT_SCALE = "input_scale"
# Read and checked (zero points must be zero: symmetric) but not kept; FBGEMM's per-layer `input_scale_ub` is the
# config's `activation_scale_ub`, which is what applies (as in transformers).
ZERO_POINTS = ("weight_zero_point", "input_zero_point")
INPUT_SCALE_UB = "input_scale_ub"
# The attribute a parameter whose checkpoint tensor is float8 carries until quantization takes it (`Fp8Channels`).
FP8_VALUES = "fp8_values"
COMPANIONS = (WEIGHT_SCALE, WEIGHT_SCALE_INV, INPUT_SCALE, INPUT_SCALE_UB, *ZERO_POINTS)


@dataclass
class _Layer:
    """One parameter's float8 weight (this rank's part) and the companion tensors read for it, by suffix."""

    weight: torch.Tensor | None = None
    companions: dict[str, torch.Tensor] = field(default_factory=dict)


class Fp8Collector:
    """Collects float8 weights and companions as the loader meets them; `attach` checks and hands them over."""

    def __init__(self, scheme: Fp8Scheme) -> None:
        self.scheme = scheme
        self.layers: dict[str, _Layer] = {}

    @staticmethod
    def is_companion(checkpoint_name: str) -> bool:
        return checkpoint_name.rsplit(".", 1)[-1] in COMPANIONS

    def add_weight(self, param: nn.Parameter, name: str, values: torch.Tensor) -> None:
        """Keeps this rank's float8 `values` for parameter `name`."""
        if values.shape != param.shape:
            raise ValueError(f"expected shape {tuple(param.shape)}, checkpoint has {tuple(values.shape)}")
        self.layers.setdefault(name, _Layer()).weight = values

    def add_companion(
        self,
        checkpoint_name: str,
        tensor: CheckpointTensor,
        layout: CheckpointLayout,
        params: dict[str, nn.Parameter],
    ) -> None:
        """Reads a scale (or zero point) for every parameter its layer's weight supplies, sliced as that weight."""
        prefix, suffix = checkpoint_name.rsplit(".", 1)
        block = self.scheme.weight_block
        if suffix == WEIGHT_SCALE_INV and block is not None:
            self._add_block_scales(checkpoint_name, tensor, layout, params, block)
            return
        names = layout.parameter_names(f"{prefix}.weight")
        if tensor.shape.numel() == 1 or suffix in ZERO_POINTS:  # zero points are only checked to be zero
            values = tensor.read().reshape(-1)
            for name in names:
                self._companions(name, checkpoint_name, params)[suffix] = values
            return
        if suffix != WEIGHT_SCALE:
            raise ValueError(f"{checkpoint_name} has shape {tuple(tensor.shape)}; only per-tensor values are supported")
        for name, part in layout.parameter_tensors(f"{prefix}.weight", tensor):
            weight_slice: CheckpointSlice | None = getattr(params.get(name), "checkpoint_slice", None)
            rows = weight_slice if weight_slice is not None and weight_slice.dim == 0 else None
            self._companions(name, checkpoint_name, params)[suffix] = part.read(rows).reshape(-1)

    def _add_block_scales(
        self,
        checkpoint_name: str,
        tensor: CheckpointTensor,
        layout: CheckpointLayout,
        params: dict[str, nn.Parameter],
        block: tuple[int, int],
    ) -> None:
        """Widens block scales to the rows and input runs each parameter the layer supplies holds on this rank."""
        offsets = layout.parameter_offsets(checkpoint_name.removesuffix(WEIGHT_SCALE_INV) + "weight")
        windows = {name: block_window(self._parameter(name, checkpoint_name, params), at) for name, at in offsets}
        if windows:
            check_block_count(tensor, list(windows.values())[-1], block)
        for name, window in windows.items():
            self._companions(name, checkpoint_name, params)[WEIGHT_SCALE_INV] = row_scales(tensor, window, block)

    def _parameter(self, name: str, checkpoint_name: str, params: dict[str, nn.Parameter]) -> nn.Parameter:
        if name not in params:
            raise ValueError(f"{checkpoint_name} scales {name!r}, which is no model parameter")
        return params[name]

    def _companions(self, name: str, checkpoint_name: str, params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
        self._parameter(name, checkpoint_name, params)
        return self.layers.setdefault(name, _Layer()).companions

    def attach(self, params: dict[str, nn.Parameter]) -> list[str]:
        """Sets each float8 parameter's `Fp8Channels` as its `FP8_VALUES`; returns the problems found, one per layer."""
        problems = []
        for name, layer in sorted(self.layers.items()):
            try:
                setattr(params[name], FP8_VALUES, self._channels(name, layer))
            except ValueError as error:
                problems.append(f"{name}: {error}")
        return problems

    def _channels(self, name: str, layer: _Layer) -> Fp8Channels:
        prefix = name.removesuffix(".weight")
        if layer.weight is None:
            found = ", ".join(sorted(layer.companions))
            raise ValueError(f"the checkpoint has {found} for {prefix} but its weight is not float8 e4m3")
        if self.scheme.weight_block is not None:
            return self._blocks(prefix, layer.weight, layer.companions, self.scheme.weight_block)
        scale = layer.companions.get(WEIGHT_SCALE)
        if scale is None:
            raise ValueError(f"float8 weight without its scale: the checkpoint lacks {prefix}.{WEIGHT_SCALE}")
        rows = layer.weight.shape[0]
        if scale.numel() not in (1, rows):
            raise ValueError(f"{prefix}.{WEIGHT_SCALE} holds {scale.numel()} scales for {rows} rows")
        for zero_point in ZERO_POINTS:
            if zero_point in layer.companions and bool(layer.companions[zero_point].ne(0).any()):
                raise ValueError(f"{prefix}.{zero_point} is not zero: asymmetric float8 is not supported")
        input_scale = layer.companions.get(INPUT_SCALE)
        if self.scheme.static_activations and input_scale is None:
            raise ValueError(f"static activation scales, but the checkpoint lacks {prefix}.{INPUT_SCALE}")
        return Fp8Channels(
            layer.weight,
            scale.float().expand(rows).contiguous(),
            None if input_scale is None else float(input_scale),
            self.scheme.activation_bound,
        )

    @staticmethod
    def _blocks(
        prefix: str, weight: torch.Tensor, companions: dict[str, torch.Tensor], block: tuple[int, int]
    ) -> Fp8Channels:
        scale = companions.get(WEIGHT_SCALE_INV)
        if scale is None:
            raise ValueError(
                f"block-wise float8 weight without its scales: the checkpoint lacks {prefix}.{WEIGHT_SCALE_INV}"
            )
        return Fp8Channels(weight, scale, input_group=block[1])


def float8_problem(values: torch.Tensor, scheme: Fp8Scheme | None) -> str | None:
    """Why float8 `values` cannot be loaded (None when they can, or are not float8)."""
    if not values.is_floating_point() or values.element_size() != 1:
        return None
    if values.dtype != FP8_DTYPE:
        return f"{values.dtype} weights are not supported (float8 e4m3 only)"
    if scheme is None:
        return "a float8 tensor, but config.json declares no quantization_config to give its scales"
    return None
