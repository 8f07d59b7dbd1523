"""Where an adapter's tensors land in the base model: each targetable projection, the fused GEMM module that computes
it, and the rows or columns this tensor-parallel rank holds."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from tandem_server.layers.gemm import GemmModule
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.lora.adapter_config import TARGET_MODULES

# A decoder layer's own module path: `model.layers.3`.
_LAYER_PATH = re.compile(r"(?:^|\.)layers\.(\d+)$")


@dataclass(frozen=True)
class TargetPart:
    """One projection an adapter may change (`model.layers.3.self_attn.v_proj`) inside the GEMM module that computes
    it: the whole module (a row-parallel layer), or one layer of a fused stack (q/k/v, gate/up)."""

    gemm_path: str
    # Position of the projection among the stack's layers (0 for a module of its own).
    index: int
    # Unsplit sizes: an adapter's A is [rank, in_features] and its B [out_features, rank] on every rank.
    in_features: int
    out_features: int
    # This rank's slice: B's rows for a column-parallel projection, A's columns for a row-parallel one.
    output_range: range
    input_range: range


@dataclass(frozen=True)
class GemmTarget:
    """A GEMM module some projection of which an adapter may change; its output is this rank's `output_size`
    features, the stacked projections' rows in order."""

    module: GemmModule
    output_size: int
    # Start of each stacked projection's rows in the module's output.
    row_offsets: tuple[int, ...]
    # This rank's input features (a row-parallel layer's slice).
    input_size: int


@dataclass(frozen=True)
class ModelTargets:
    """Every targetable projection of a model, by its checkpoint path, and the GEMM modules computing them."""

    parts: dict[str, TargetPart]
    gemms: dict[str, GemmTarget]
    num_layers: int


def find_targets(model: nn.Module) -> ModelTargets:
    """The projections of `model` named in TARGET_MODULES that run through a fused column stack or a row-parallel
    layer (a projection a family calls on its own is not targetable)."""
    parts: dict[str, TargetPart] = {}
    gemms: dict[str, GemmTarget] = {}
    modules = dict(model.named_modules())
    layer_numbers = [int(match[1]) for path in modules if (match := _LAYER_PATH.search(path))]
    for path, module in modules.items():
        parent_path, _, own_name = path.rpartition(".")
        if isinstance(module, StackedColumns):
            named = _stacked_names(modules.get(parent_path), module)
            if named is None:
                continue
            offsets = _offsets([len(layer.output_range) for layer in module.layers])
            gemms[path] = GemmTarget(module, sum(module.sizes), offsets, module.layers[0].in_features)
            for index, (name, layer) in enumerate(zip(named, module.layers, strict=True)):
                full_input = range(layer.in_features)
                parts[f"{parent_path}.{name}"] = TargetPart(
                    path, index, layer.in_features, layer.out_features, layer.output_range, full_input
                )
        elif isinstance(module, RowParallelLinear) and own_name in TARGET_MODULES:
            gemms[path] = GemmTarget(module, module.out_features, (0,), len(module.input_range))
            full_output = range(module.out_features)
            parts[path] = TargetPart(path, 0, module.in_features, module.out_features, full_output, module.input_range)
    return ModelTargets(parts, gemms, max(layer_numbers, default=-1) + 1)


def _stacked_names(parent: nn.Module | None, stack: StackedColumns) -> list[str] | None:
    """The attribute names of the stack's layers in its parent, when every one is a targetable projection."""
    if parent is None:
        return None
    by_identity = {id(child): name for name, child in parent.named_children()}
    names = [by_identity.get(id(layer)) for layer in stack.layers]
    if not all(isinstance(layer, ColumnParallelLinear) for layer in stack.layers):
        return None
    if any(name not in TARGET_MODULES for name in names):
        return None
    return [name for name in names if name is not None]


def _offsets(sizes: list[int]) -> tuple[int, ...]:
    offsets, start = [], 0
    for size in sizes:
        offsets.append(start)
        start += size
    return tuple(offsets)
