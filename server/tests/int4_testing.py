"""Tiny GPTQ and AWQ checkpoints written from a float checkpoint by a plain reference packer (loops over nibbles,
independent of the server's unpacking), with the integer values each stores and the float values they stand for."""

from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LINEAR_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")
# Layers that read the same input: an act-order checkpoint orders their inputs alike (by that input's statistics).
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
# AWQ's gemm order: the i-th nibble (bits 4i to 4i + 3) of each int32 holds column AWQ_ORDER[i] of its eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class Int4Values:
    """One layer's unpacked values: `q` `[in, out]` (0..15), true zero points `z` and float16 scales `s`, both
    `[groups, out]`, and the group of each input feature."""

    q: torch.Tensor
    z: torch.Tensor
    s: torch.Tensor
    group_of_input: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The float32 `[out, in]` weight: w[o, i] = (q[i, o] - z[g(i), o]) * s[g(i), o]."""
        z = self.z[self.group_of_input].float()
        s = self.s[self.group_of_input].float()
        return ((self.q.float() - z) * s).t().contiguous()


def pack_along_rows(values: torch.Tensor) -> torch.Tensor:
    """int32 `[r / 8, c]`: nibble i of packed row j holds value row 8 j + i (GPTQ's qweight)."""
    ints = values.numpy().astype(np.uint32)
    packed = np.zeros((ints.shape[0] // 8, ints.shape[1]), dtype=np.uint32)
    for j in range(packed.shape[0]):
        for i in range(8):
            packed[j] |= ints[8 * j + i] << np.uint32(4 * i)
    return torch.from_numpy(packed.view(np.int32))


def pack_along_columns(values: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 `[r, c / 8]`: nibble i of packed column j holds value column 8 j + order[i]."""
    ints = values.numpy().astype(np.uint32)
    packed = np.zeros((ints.shape[0], ints.shape[1] // 8), dtype=np.uint32)
    for j in range(packed.shape[1]):
        for i in range(8):
            packed[:, j] |= ints[:, 8 * j + order[i]] << np.uint32(4 * i)
    return torch.from_numpy(packed.view(np.int32))


def groups_of_inputs(name: str, in_features: int, group_size: int | None, act_order: bool) -> torch.Tensor:
    """Each input's group: runs of `group_size` inputs, or with `act_order` the inputs in an order drawn for the
    layer's input, `group_size` at a time (as GPTQ's `desc_act` groups them)."""
    size = group_size or in_features
    in_order = torch.arange(in_features) // size
    if not act_order:
        return in_order
    role = name.rsplit(".", 2)[-2]
    key = f"{name.rsplit('.', 2)[0]}.{SHARED_INPUT.get(role, role)}"
    order = torch.randperm(in_features, generator=torch.Generator().manual_seed(zlib.crc32(key.encode())))
    return torch.empty_like(in_order).index_copy_(0, order, in_order)


def quantize_layer(weight: torch.Tensor, group_of_input: torch.Tensor, symmetric: bool, lowest_zero: int) -> Int4Values:
    """Min-max int4 of a float `[out, in]` weight per group of inputs, zero points at least `lowest_zero` (GPTQ's v1
    format cannot store 0)."""
    columns = weight.t().float()
    groups = range(int(group_of_input.max()) + 1)
    low = torch.stack([columns[group_of_input == group].amin(0) for group in groups])
    high = torch.stack([columns[group_of_input == group].amax(0) for group in groups])
    if symmetric:
        s = (torch.maximum(high.abs(), low.abs()) / 7.5).clamp_min(1e-4).half()
        z = torch.full_like(low, 8, dtype=torch.int64)
    else:
        s = ((high - low) / 15).clamp_min(1e-4).half()
        z = (-low / s.float()).round().clamp(lowest_zero, 15).to(torch.int64)
    q = (weight.t().float() / s.float()[group_of_input]).round() + z[group_of_input]
    return Int4Values(q.clamp(0, 15).to(torch.int64), z, s, group_of_input)


def gptq_config(group_size: int, checkpoint_format: str = "gptq", symmetric: bool = False) -> dict[str, Any]:
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "desc_act": False,
        "sym": symmetric,
        "checkpoint_format": checkpoint_format,
    }


def awq_config(group_size: int) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemm", "zero_point": True}


def stored_tensors(values: Int4Values, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A layer's tensors as the checkpoint in `config`'s layout stores them."""
    if config["quant_method"] == "awq":
        return {
            "qweight": pack_along_columns(values.q, AWQ_ORDER),
            "qzeros": pack_along_columns(values.z, AWQ_ORDER),
            "scales": values.s,
        }
    stored_zeros = values.z - 1 if config.get("checkpoint_format", "gptq") == "gptq" else values.z
    return {
        "qweight": pack_along_rows(values.q),
        "qzeros": pack_along_columns(stored_zeros),
        "scales": values.s,
        "g_idx": values.group_of_input.to(torch.int32),
    }


def write_int4_checkpoint(float_dir: Path, out_dir: Path, config: dict[str, Any]) -> dict[str, Int4Values]:
    """Writes `float_dir`'s checkpoint with every decoder linear layer in `config`'s int4 layout (embeddings, norms
    and the LM head stay float); returns each layer's values by its weight's name."""
    tensors = load_file(str(float_dir / "model.safetensors"))
    group_size = None if config["group_size"] == -1 else config["group_size"]
    gptq_v1 = config["quant_method"] == "gptq" and config.get("checkpoint_format", "gptq") == "gptq"
    stored: dict[str, torch.Tensor] = {}
    layers: dict[str, Int4Values] = {}
    for name, tensor in tensors.items():
        if not (name.endswith(".weight") and name.rsplit(".", 2)[-2] in LINEAR_ROLES):
            stored[name] = tensor
            continue
        group_of_input = groups_of_inputs(name, tensor.shape[1], group_size, bool(config.get("desc_act")))
        values = quantize_layer(tensor, group_of_input, bool(config.get("sym")), lowest_zero=1 if gptq_v1 else 0)
        layers[name] = values
        prefix = name.removesuffix(".weight")
        stored.update({f"{prefix}.{suffix}": t for suffix, t in stored_tensors(values, config).items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(out_dir / "model.safetensors"))
    for file in float_dir.iterdir():
        if file.suffix == ".json":
            shutil.copy(file, out_dir / file.name)
    hf = json.loads((float_dir / "config.json").read_text())
    hf["quantization_config"] = config
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2))
    return layers


def dequantized_state(float_dir: Path, layers: dict[str, Int4Values]) -> dict[str, torch.Tensor]:
    """The float checkpoint's tensors with each int4 layer's weight replaced by the values it stands for."""
    tensors = load_file(str(float_dir / "model.safetensors"))
    return {name: layers[name].dequantize() if name in layers else tensor for name, tensor in tensors.items()}
