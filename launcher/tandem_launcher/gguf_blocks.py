"""Keeps a GGUF's Q4_0/Q4_1/Q8_0 tensors as their raw blocks beside the float conversion, for quantized serving.

Each block tensor is stored under the name of the float tensor it dequantizes to, with its rows put in the same order
as the conversion put the float tensor's rows (the Llama family's q/k rows are permuted); a tensor is kept only when
its blocks dequantize exactly to the float tensor the conversion wrote.

A mixture-of-experts layer's expert stacks (`blk.N.ffn_{gate,up,down}_exps`, `[experts, rows, blocks]`) are kept the
same way under the stacked names transformers gives them: `mlp.experts.gate_up_proj` (the gate stack's rows then the
up stack's, which must share a block type) and `mlp.experts.down_proj`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tandem_server.weights.gguf_format import BLOCK_BYTES, GGUF_BLOCKS_DIR, GGUF_TYPES_KEY

from tandem_launcher.gguf_experts import EXPERT_STACK, GATE_UP_ORDER, stack_gate_up
from tandem_launcher.gguf_families import gguf_weight_names

logger = logging.getLogger(__name__)
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})


def write_gguf_blocks(gguf_path: Path, model: Any, output_dir: Path) -> int:
    """Writes `output_dir/GGUF_BLOCKS_DIR/model.safetensors`; returns how many tensors it keeps as blocks."""
    reader = GGUFReader(gguf_path)
    processor, hf_names = gguf_weight_names(reader, model)
    float_tensors = model.state_dict()
    kept: dict[str, tuple[torch.Tensor, str]] = {}
    unsupported: Counter[str] = Counter()
    # Stacked name -> {"gate"/"up"/"down": (GGUF tensor name, blocks, type)}.
    expert_parts: dict[str, dict[str, tuple[str, np.ndarray, Any]]] = {}
    for tensor in reader.tensors:
        gguf_type = tensor.tensor_type.name
        expert = EXPERT_STACK.fullmatch(tensor.name)
        if gguf_type not in BLOCK_BYTES or len(tensor.data.shape) != (3 if expert else 2):
            if gguf_type not in FLOAT_TYPES:
                unsupported[gguf_type] += 1
            continue
        if expert is not None:
            hf_name = hf_names.get(expert["stack"])
            if hf_name is not None:
                parts = expert_parts.setdefault(hf_name, {})
                parts[expert["part"]] = (tensor.name, np.array(tensor.data), tensor.tensor_type)
            continue
        processed = processor.process(weights=np.asarray(tensor.data), name=tensor.name)
        hf_name = hf_names.get(processed.name)
        if hf_name is None or hf_name in kept:
            continue
        _keep(hf_name, tensor.name, np.array(processed.weights, order="C"), tensor.tensor_type, float_tensors, kept)
    for hf_name, parts in expert_parts.items():
        _keep_expert_stack(hf_name, parts, float_tensors, kept)
    types = {name: gguf_type for name, (_, gguf_type) in kept.items()}
    if unsupported:
        logger.warning(
            "%s served dequantized to float32: --quantize gguf keeps only %s tensors quantized",
            ", ".join(f"{count} {kind} tensors" for kind, count in sorted(unsupported.items())),
            "/".join(BLOCK_BYTES),
        )
    if kept:
        blocks_dir = output_dir / GGUF_BLOCKS_DIR
        blocks_dir.mkdir()
        blocks = {name: rows for name, (rows, _) in kept.items()}
        save_file(blocks, str(blocks_dir / "model.safetensors"), metadata={GGUF_TYPES_KEY: json.dumps(types)})
    return len(kept)


def _keep(
    hf_name: str,
    gguf_name: str,
    rows: np.ndarray,
    gguf_type: Any,
    float_tensors: dict[str, torch.Tensor],
    kept: dict[str, tuple[torch.Tensor, str]],
) -> None:
    """Keeps `rows` of blocks as `hf_name` when they dequantize exactly to the conversion's float tensor."""
    expected = float_tensors.get(hf_name)
    if expected is None:
        return
    if not np.array_equal(dequantize(rows, gguf_type), expected.numpy()):
        logger.warning("%s (%s) stays float: its blocks do not match the conversion", gguf_name, gguf_type.name)
        return
    kept[hf_name] = (torch.from_numpy(rows), gguf_type.name)


def _keep_expert_stack(
    hf_name: str,
    parts: dict[str, tuple[str, np.ndarray, Any]],
    float_tensors: dict[str, torch.Tensor],
    kept: dict[str, tuple[torch.Tensor, str]],
) -> None:
    """Keeps a down stack as it is, and a gate and an up stack as one `[experts, 2 * rows, blocks]` tensor."""
    if "down" in parts:
        _keep(hf_name, *parts["down"], float_tensors, kept)
        return
    if set(parts) != set(GATE_UP_ORDER):
        return
    (gate_name, _, gate_type), (up_name, _, up_type) = (parts[part] for part in GATE_UP_ORDER)
    if gate_type != up_type:
        logger.warning(
            "%s (%s) and %s (%s) stay float: one stacked tensor holds one block type",
            gate_name, gate_type.name, up_name, up_type.name,
        )  # fmt: skip
        return
    blocks = stack_gate_up({part: rows for part, (_, rows, _) in parts.items()})
    _keep(hf_name, gate_name, blocks, gate_type, float_tensors, kept)
