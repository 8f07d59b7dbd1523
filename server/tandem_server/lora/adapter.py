"""Loads one PEFT LoRA adapter for this rank: its tensors checked against the base model's projections, sliced like
the layers they change and packed per GEMM module, the scaling folded into B."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from tandem_server.errors import LoraAdapterError
from tandem_server.lora.adapter_config import TARGET_MODULES, WEIGHTS_FILE, LoraConfig, read_adapter_config
from tandem_server.lora.targets import ModelTargets, TargetPart

# PEFT saves `base_model.model.<the base model's parameter path>.lora_A.weight` (and lora_B).
_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<part>.+)\.lora_(?P<kind>[AB])\.weight")
_LAYER_INDEX = re.compile(r"\blayers\.(\d+)\.")


@dataclass(frozen=True)
class LoraDelta:
    """An adapter's change to one GEMM module's output: `(x @ a.T) @ b.T`. `a` stacks the A of each projection it
    targets in the module [projections * rank, in]; `b` [module rows, projections * rank] holds each projection's
    scaled B in that projection's rows and columns, zero elsewhere (a projection it does not target gets nothing)."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class LoraAdapter:
    """A loaded adapter: what Info reports of it, and its deltas by GEMM module path."""

    name: str
    rank: int
    # Sorted module names (q_proj, v_proj, ...) the adapter changes in some layer.
    target_modules: tuple[str, ...]
    deltas: dict[str, LoraDelta]

    @property
    def nbytes(self) -> int:
        return sum(delta.a.nbytes + delta.b.nbytes for delta in self.deltas.values())


@dataclass(frozen=True)
class AdapterSummary:
    """What Info reports of a loaded adapter, and the PEFT directory the shard reads it from again."""

    name: str
    rank: int
    target_modules: tuple[str, ...]
    directory: Path


@dataclass(frozen=True)
class AdapterPlacement:
    """Where and how an adapter's tensors are kept: the model's dtype and device, and the largest rank served."""

    dtype: torch.dtype
    device: torch.device
    max_rank: int


def load_adapter(name: str, directory: Path, targets: ModelTargets, placement: AdapterPlacement) -> LoraAdapter:
    """Reads adapter `name` from a PEFT directory and checks every tensor against the base model; raises
    LoraAdapterError naming the adapter, the tensor and what was expected."""
    config = read_adapter_config(name, directory)
    if config.rank > placement.max_rank:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: rank {config.rank} is above the shard's --max-lora-rank {placement.max_rank}"
        )
    pairs = _read_pairs(name, directory, config, targets)
    by_gemm: dict[str, list[tuple[TargetPart, torch.Tensor, torch.Tensor]]] = {}
    for part_path, (a, b) in sorted(pairs.items()):
        part = targets.parts[part_path]
        _check_shapes(name, part_path, part, config.rank, a, b)
        by_gemm.setdefault(part.gemm_path, []).append((part, a, b))
    deltas = {gemm_path: _packed(targets, gemm_path, parts, config, placement) for gemm_path, parts in by_gemm.items()}
    modules = sorted({part_path.rpartition(".")[2] for part_path in pairs})
    return LoraAdapter(name, config.rank, tuple(modules), deltas)


def _read_pairs(
    name: str, directory: Path, config: LoraConfig, targets: ModelTargets
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The (A, B) pair of every projection the adapter's file holds, by the projection's path in the model."""
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} is missing (expected PEFT's {WEIGHTS_FILE})")
    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as error:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} is not a readable safetensors file: {error}") from error
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _TENSOR_NAME.fullmatch(key)
        if match is None:
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: tensor {key} is not a LoRA A or B weight "
                "(expected base_model.model.<module>.lora_A.weight or .lora_B.weight)"
            )
        part_path = match["part"]
        _check_target(name, key, part_path, config, targets)
        halves.setdefault(part_path, {})[match["kind"]] = tensor
    if not halves:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} holds no LoRA weights")
    pairs = {}
    for part_path, half in halves.items():
        missing = sorted({"A", "B"} - set(half))
        if missing:
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: tensor base_model.model.{part_path}.lora_{missing[0]}.weight is missing "
                "(every targeted module needs both lora_A and lora_B)"
            )
        pairs[part_path] = (half["A"], half["B"])
    return pairs


def _check_target(name: str, key: str, part_path: str, config: LoraConfig, targets: ModelTargets) -> None:
    module = part_path.rpartition(".")[2]
    layer = _LAYER_INDEX.search(part_path)
    if layer is not None and int(layer[1]) >= targets.num_layers:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {key} is for layer {layer[1]}, beyond the base model's "
            f"{targets.num_layers} layers (0..{targets.num_layers - 1})"
        )
    if module not in TARGET_MODULES:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {key} targets unknown module {module!r}; supported target modules: "
            f"{', '.join(TARGET_MODULES)}"
        )
    if config.target_modules is not None and module not in config.target_modules:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {key} targets {module!r}, which its target_modules "
            f"{sorted(config.target_modules)} does not list"
        )
    if part_path not in targets.parts:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {key} targets {part_path}, which this base model does not compute "
            "as a targetable projection"
        )


def _check_shapes(name: str, part_path: str, part: TargetPart, rank: int, a: torch.Tensor, b: torch.Tensor) -> None:
    prefix = f"base_model.model.{part_path}"
    expected_a, expected_b = (rank, part.in_features), (part.out_features, rank)
    if tuple(a.shape) != expected_a:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {prefix}.lora_A.weight has shape {list(a.shape)}, expected "
            f"{list(expected_a)} ([r, in_features] with r={rank})"
        )
    if tuple(b.shape) != expected_b:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: tensor {prefix}.lora_B.weight has shape {list(b.shape)}, expected "
            f"{list(expected_b)} ([out_features, r] with r={rank})"
        )


def _packed(
    targets: ModelTargets,
    gemm_path: str,
    parts: list[tuple[TargetPart, torch.Tensor, torch.Tensor]],
    config: LoraConfig,
    placement: AdapterPlacement,
) -> LoraDelta:
    """One GEMM module's delta: this rank's slices of the targeted projections' A stacked, their scaled B placed in
    the projections' rows of a block-diagonal B."""
    gemm = targets.gemms[gemm_path]
    rank = config.rank
    a = torch.cat([part_a[:, part.input_range.start : part.input_range.stop] for part, part_a, _ in parts])
    b = torch.zeros(gemm.output_size, rank * len(parts), dtype=torch.float32)
    for column, (part, _, part_b) in enumerate(parts):
        rows = part_b[part.output_range.start : part.output_range.stop].float() * config.scaling
        start = gemm.row_offsets[part.index]
        b[start : start + rows.shape[0], column * rank : (column + 1) * rank] = rows
    return LoraDelta(
        a.to(placement.device, placement.dtype).contiguous(), b.to(placement.device, placement.dtype).contiguous()
    )
