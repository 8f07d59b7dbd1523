"""Unpacks GPTQ and AWQ int4 tensors (eight 4-bit values per int32, lowest bits first) and turns a layer's values,
zero points and scales into the kernel's `Int4Groups`.

The kernel computes `(q - 8) * scale + zero` per group; a checkpoint's `(q - z) * s` is that with `scale = s` and
`zero = (8 - z) * s`, exactly in float32 (a float16 scale times an integer below 32 needs at most 16 significant bits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.quant.values import INT4_KERNEL_GROUPS, INT4_MIDPOINT, INT4_OUT_MULTIPLE, Int4Groups

NIBBLES = 8
# AWQ's gemm packing: nibble i of an int32 holds column AWQ_NIBBLE_ORDER[i] of its eight output columns.
AWQ_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 `[r, c]` packed along dim 0 as uint8 `[8 r, c]`: nibble i of row j is row 8 j + i."""
    nibbles = (packed.unsqueeze(1) >> _SHIFTS.view(1, NIBBLES, 1)) & 0xF
    return nibbles.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_columns(packed: torch.Tensor, awq_order: bool) -> torch.Tensor:
    """int32 `[r, c]` packed along dim 1 as uint8 `[r, 8 c]`: nibble i of column j is column 8 j + i, or with
    `awq_order` column 8 j + AWQ_NIBBLE_ORDER[i]."""
    nibbles = (packed.unsqueeze(-1) >> _SHIFTS) & 0xF
    if awq_order:
        column_nibble = sorted(range(NIBBLES), key=AWQ_NIBBLE_ORDER.__getitem__)
        nibbles = nibbles[..., column_nibble]
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def covering(run: range) -> range:
    """The packed indices (eight values each) that hold `run`."""
    return range(run.start // NIBBLES, -(-run.stop // NIBBLES))


def trimmed(unpacked: torch.Tensor, dim: int, run: range) -> torch.Tensor:
    """`run` out of values unpacked from `covering(run)` along `dim`."""
    return unpacked.narrow(dim, run.start % NIBBLES, len(run))


@dataclass(frozen=True)
class GroupWindow:
    """The checkpoint group rows a run of input features uses, and how many of those inputs each group spans."""

    rows: range
    size: int


def group_window(inputs: range, group_size: int | None) -> GroupWindow:
    """The groups `inputs` fall in; a run that splits a group (other than the only one) cannot be served."""
    if group_size is None:
        return GroupWindow(range(1), len(inputs))
    if inputs.start % group_size or inputs.stop % group_size:
        raise ValueError(
            f"input features [{inputs.start}, {inputs.stop}) split groups of {group_size}: the groups cannot be "
            "divided evenly among the ranks (use fewer shards)"
        )
    return GroupWindow(range(inputs.start // group_size, inputs.stop // group_size), group_size)


def kernel_group(group_size: int) -> int:
    """The largest group the kernel takes that divides a checkpoint's groups."""
    for size in sorted(INT4_KERNEL_GROUPS, reverse=True):
        if group_size % size == 0:
            return size
    raise ValueError(f"groups of {group_size} input features are no multiple of {min(INT4_KERNEL_GROUPS)}")


@dataclass(frozen=True)
class Int4Layer:
    """One parameter's part of a checkpoint layer, unpacked: values `[in, out]`, integer zero points (with any
    stored offset added) and float scales `[groups, out]`, and the inputs each group spans; with `input_order`
    (act-order), the inputs of group 0, then group 1, ... (else groups are runs of inputs)."""

    values: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_size: int
    input_order: torch.Tensor | None = None

    def groups(self) -> Int4Groups:
        """The kernel's form of these values: `[out, in]`, groups split to a size the kernel takes."""
        out_features = self.values.shape[1]
        if out_features % INT4_OUT_MULTIPLE:
            raise ValueError(
                f"{out_features} output features on this rank; the int4 kernel needs multiples of {INT4_OUT_MULTIPLE}"
            )
        size = kernel_group(self.group_size)
        repeat = self.group_size // size
        scale = self.scales.t().float().repeat_interleave(repeat, dim=1)
        zero = (INT4_MIDPOINT - self.zeros.t().float()).repeat_interleave(repeat, dim=1) * scale
        values = self.values if self.input_order is None else self.values.index_select(0, self.input_order)
        return Int4Groups(values.t().contiguous(), scale.contiguous(), zero.contiguous(), size, self.input_order)


def act_order(group_of_input: torch.Tensor, group_size: int) -> torch.Tensor:
    """The inputs group by group (each group's in input order), given each input's group (GPTQ's `g_idx`); every
    group must hold exactly `group_size` inputs."""
    counts = torch.bincount(group_of_input.long())
    if not bool((counts == group_size).all()):
        raise ValueError(f"g_idx gives groups of {sorted(set(counts.tolist()))} inputs, not {group_size} each")
    return torch.argsort(group_of_input.long(), stable=True)
