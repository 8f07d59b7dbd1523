"""Which part of a checkpoint tensor a rank holds, read straight from the file without the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


class LazyTensor(Protocol):
    """A checkpoint tensor not yet read (safetensors' `get_slice` handle)."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor: ...


@dataclass(frozen=True)
class CheckpointSlice:
    """Indices `[start, stop)` along `dim` of a checkpoint tensor; a parameter carrying one holds only that part."""

    dim: int
    start: int
    stop: int

    @classmethod
    def of(cls, dim: int, run: range) -> CheckpointSlice:
        """The slice covering the contiguous `run` along `dim`."""
        return cls(dim, run.start, run.stop)


class CheckpointTensor:
    """An unread checkpoint tensor, one entry of its first dimension (an expert of a stacked expert tensor), or a
    window of rows (a fused tensor's part) of either; reads only what is asked."""

    def __init__(
        self, source: LazyTensor, row_offset: int = 0, rows: int | None = None, leading: tuple[int, ...] = ()
    ) -> None:
        self._source = source
        # Fixed indices of the source's first dimensions; `shape` and reads cover the dimensions after them.
        self._leading = leading
        full_shape = list(source.get_shape())[len(leading) :]
        self._row_offset = row_offset
        if full_shape:
            full_shape[0] = full_shape[0] - row_offset if rows is None else rows
        self.shape = torch.Size(full_shape)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        """Rows `[start, start + length)`, still unread (only dim 0 can be narrowed)."""
        if dim != 0 or not 0 <= start <= start + length <= self.shape[0]:
            raise ValueError(f"cannot narrow dim {dim} to [{start}, {start + length}) of shape {tuple(self.shape)}")
        return CheckpointTensor(self._source, self._row_offset + start, length, self._leading)

    def select(self, index: int) -> CheckpointTensor:
        """Entry `index` of the first dimension, still unread (only of a tensor not yet narrowed)."""
        if self._row_offset or not self.shape or not 0 <= index < self.shape[0]:
            raise ValueError(f"cannot select entry {index} of shape {tuple(self.shape)}")
        return CheckpointTensor(self._source, leading=(*self._leading, index))

    def read(self, part: CheckpointSlice | None = None) -> torch.Tensor:
        """Materialises `part` of this tensor (all of it when None) and nothing else."""
        ndim = len(self.shape)
        bounds = [(0, size) for size in self.shape]
        if part is not None:
            if not 0 <= part.dim < ndim or not 0 <= part.start <= part.stop <= self.shape[part.dim]:
                raise ValueError(f"slice [{part.start}:{part.stop}] of dim {part.dim} is outside {tuple(self.shape)}")
            bounds[part.dim] = (part.start, part.stop)
        if ndim:
            bounds[0] = (bounds[0][0] + self._row_offset, bounds[0][1] + self._row_offset)
        index = tuple(slice(i, i + 1) for i in self._leading) + tuple(slice(start, stop) for start, stop in bounds)
        values = self._source[index]
        return values.reshape(values.shape[len(self._leading) :]) if self._leading else values


def load_full(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copies a tensor (or a rank's slice of one) that must match the parameter's shape exactly."""
    if param.shape != loaded.shape:
        raise ValueError(f"expected shape {tuple(param.shape)}, checkpoint has {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def sliced_parameter(
    shape: tuple[int, ...], part: CheckpointSlice | None, dtype: torch.dtype | None = None
) -> nn.Parameter:
    """An uninitialised parameter (of the default dtype unless given) that loads `part` of its checkpoint tensor
    (all of it when None)."""
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter
    if part is not None:
        param.checkpoint_slice = part  # type: ignore[attr-defined]  # a loading tag carried on the parameter
    return param
