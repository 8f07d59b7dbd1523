"""Gathers a GPTQ or AWQ checkpoint's packed int4 tensors per parameter, each rank its slice, as `Int4Groups`.

A column-parallel parameter (and each part of a fused tensor) keeps its output columns of every tensor; a
row-parallel one keeps its input features' rows of `qweight` and `g_idx` and its groups' rows of `qzeros` and
`scales`, so its inputs must cover whole groups. Packing need not align with a rank's run: the int32s covering it
are read and unpacked, and the run is cut out. An act-order layer (`g_idx` out of order) is permuted into runs of
groups, which only a rank holding all its inputs can do. Shapes are checked against the whole tensors once
everything is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tandem_server.quant.int4.packing import (
    NIBBLES,
    Int4Layer,
    act_order,
    covering,
    group_window,
    trimmed,
    unpack_columns,
    unpack_rows,
)
from tandem_server.quant.int4.scheme import Int4Scheme
from tandem_server.quant.values import Int4Groups
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor

QWEIGHT, QZEROS, SCALES, G_IDX = "qweight", "qzeros", "scales", "g_idx"
COMPONENTS = (QWEIGHT, QZEROS, SCALES, G_IDX)
# The attribute a parameter served from packed int4 tensors carries until quantization takes it (`Int4Groups`).
INT4_VALUES = "int4_values"


@dataclass(frozen=True)
class _Window:
    """The output columns and input features of a checkpoint layer that one parameter holds."""

    outputs: range
    inputs: range


@dataclass
class _Parameter:
    """What was read for one parameter: its layer's name, its window and its unpacked tensors by suffix."""

    prefix: str
    window: _Window
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class Int4Collector:
    """Reads packed int4 tensors as the loader meets them; `attach` checks them and hands them over."""

    def __init__(self, scheme: Int4Scheme, layout: CheckpointLayout, params: dict[str, nn.Parameter]) -> None:
        self.scheme = scheme
        self.layout = layout
        self.params = params
        self.parameters: dict[str, _Parameter] = {}
        self.shapes: dict[str, dict[str, torch.Size]] = {}
        self.attached: set[str] = set()

    @staticmethod
    def takes(checkpoint_name: str) -> bool:
        return checkpoint_name.rsplit(".", 1)[-1] in COMPONENTS

    def add(self, checkpoint_name: str, tensor: CheckpointTensor) -> None:
        """Reads this rank's part of a packed tensor for every parameter its layer supplies."""
        prefix, suffix = checkpoint_name.rsplit(".", 1)
        self.shapes.setdefault(prefix, {})[suffix] = tensor.shape
        for name, offset in self.layout.parameter_offsets(f"{prefix}.weight"):
            param = self.params.get(name)
            if param is None:
                raise ValueError(f"{checkpoint_name} packs {name!r}, which is no model parameter")
            record = self.parameters.setdefault(name, _Parameter(prefix, _window(param, offset)))
            record.tensors[suffix] = self._read(suffix, tensor, record.window)

    def _read(self, suffix: str, tensor: CheckpointTensor, window: _Window) -> torch.Tensor:
        gptq = self.scheme.packed_along_inputs
        if len(tensor.shape) != (1 if suffix == G_IDX else 2):
            raise ValueError(f"{suffix} has shape {tuple(tensor.shape)}")
        if suffix == G_IDX:
            return tensor.read(CheckpointSlice.of(0, window.inputs))
        if suffix == QWEIGHT and gptq:
            return trimmed(unpack_rows(_read(tensor, covering(window.inputs), window.outputs)), 0, window.inputs)
        if suffix == QWEIGHT:
            packed = _read(tensor, window.inputs, covering(window.outputs))
            return trimmed(unpack_columns(packed, awq_order=True), 1, window.outputs)
        groups = group_window(window.inputs, self.scheme.group_size).rows
        if suffix == SCALES:
            return _read(tensor, groups, window.outputs)
        zeros = unpack_columns(_read(tensor, groups, covering(window.outputs)), awq_order=not gptq)
        return trimmed(zeros, 1, window.outputs).to(torch.int32) + self.scheme.zeros_offset

    def attach(self) -> list[str]:
        """Sets each parameter's `Int4Groups` as its `INT4_VALUES`; returns the problems found, one per layer."""
        problems = []
        for name, record in sorted(self.parameters.items()):
            try:
                setattr(self.params[name], INT4_VALUES, self._groups(name, record))
                self.attached.add(name)
            except ValueError as error:
                problems.append(f"{record.prefix}: {error}")
        return problems

    def _groups(self, name: str, record: _Parameter) -> Int4Groups:
        missing = [suffix for suffix in (QWEIGHT, QZEROS, SCALES) if suffix not in record.tensors]
        if missing:
            raise ValueError(f"the checkpoint lacks {', '.join(f'{record.prefix}.{suffix}' for suffix in missing)}")
        self._check_whole_shapes(record.prefix)
        values, zeros, scales = (record.tensors[suffix] for suffix in (QWEIGHT, QZEROS, SCALES))
        param = self.params[name]
        if (values.shape[1], values.shape[0]) != param.shape:
            raise ValueError(
                f"expected {tuple(param.shape)} weights, {QWEIGHT} holds {values.shape[1]} x {values.shape[0]}"
            )
        group = group_window(record.window.inputs, self.scheme.group_size)
        expected = (len(group.rows), values.shape[1])
        for suffix, tensor in ((SCALES, scales), (QZEROS, zeros)):
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{suffix} holds {tuple(tensor.shape)} for this rank, expected {expected}")
        order = self._input_order(record)
        return Int4Layer(values, zeros, scales, group.size, order).groups()

    def _input_order(self, record: _Parameter) -> torch.Tensor | None:
        """The act-order permutation `g_idx` gives (None when its groups are runs of inputs); only a rank holding all
        the inputs can take one, since its groups cover inputs anywhere."""
        g_idx = record.tensors.get(G_IDX)
        inputs = record.window.inputs
        size = self.scheme.group_size
        if g_idx is None or size is None or torch.equal(g_idx.long(), torch.arange(inputs.start, inputs.stop) // size):
            return None
        in_features = self.shapes[record.prefix][G_IDX][0]
        if len(inputs) != in_features:
            raise ValueError(
                f"g_idx puts input features in groups out of order (act-order), so this rank's inputs "
                f"[{inputs.start}, {inputs.stop}) of {in_features} hold parts of any group: act-order layers split "
                "along their inputs (row-parallel) are not supported across ranks"
            )
        return act_order(g_idx, size)

    def _check_whole_shapes(self, prefix: str) -> None:
        """The whole tensors agree: as many groups in `scales` and `qzeros` as `qweight`'s inputs make, as many
        outputs everywhere."""
        shapes = self.shapes[prefix]
        qweight = shapes[QWEIGHT]
        if self.scheme.packed_along_inputs:
            in_features, out_features = qweight[0] * NIBBLES, qweight[1]
        else:
            in_features, out_features = qweight[0], qweight[1] * NIBBLES
        group_size = self.scheme.group_size or in_features
        groups = -(-in_features // group_size)
        expected = {
            SCALES: (groups, out_features),
            QZEROS: (groups, out_features // NIBBLES),
            G_IDX: (in_features,),
        }
        for suffix, shape in expected.items():
            if suffix in shapes and tuple(shapes[suffix]) != shape:
                raise ValueError(
                    f"{suffix} has shape {tuple(shapes[suffix])}; {QWEIGHT} {tuple(qweight)} with groups of "
                    f"{group_size} needs {shape}"
                )
        if in_features % group_size:
            raise ValueError(f"{in_features} input features do not make whole groups of {group_size}")


def _window(param: nn.Parameter, offset: int) -> _Window:
    """The part of its checkpoint layer `param` holds: rows `offset` on of a fused tensor, and its rank's slice."""
    out_features, in_features = param.shape
    part: CheckpointSlice | None = getattr(param, "checkpoint_slice", None)
    if part is not None and part.dim == 0:
        return _Window(range(offset + part.start, offset + part.stop), range(in_features))
    if part is not None:
        return _Window(range(offset, offset + out_features), range(part.start, part.stop))
    return _Window(range(offset, offset + out_features), range(in_features))


def _read(tensor: CheckpointTensor, rows: range, columns: range) -> torch.Tensor:
    """Rows `rows`, columns `columns` of a 2-D tensor, reading from the file only the dimension that is cut."""
    if columns.stop > tensor.shape[1]:
        raise ValueError(f"columns [{columns.start}, {columns.stop}) are outside {tuple(tensor.shape)}")
    if len(rows) == tensor.shape[0]:
        return tensor.read(CheckpointSlice.of(1, columns))
    return tensor.read(CheckpointSlice.of(0, rows))[:, columns.start : columns.stop]
