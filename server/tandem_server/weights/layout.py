"""How checkpoint tensor names relate to model parameters beyond a one-to-one match."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from tandem_server.weights.slicing import CheckpointTensor


@dataclass(frozen=True)
class FusedTensor:
    """A checkpoint tensor (named by its suffix) that holds several parameters stacked along dim 0."""

    suffix: str
    # (parameter suffix, rows) in stacking order; the rows add up to the fused tensor's first dimension.
    parts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class CheckpointLayout:
    """Tensors to skip (a tied head's duplicate) and fused tensors to split before per-rank slicing."""

    skipped: frozenset[str] = frozenset()
    fused: tuple[FusedTensor, ...] = field(default=())

    def parameter_tensors(self, name: str, tensor: CheckpointTensor) -> Iterator[tuple[str, CheckpointTensor]]:
        """The `(parameter name, unread tensor)` pairs that checkpoint tensor `name` supplies."""
        if name in self.skipped:
            return
        for fused in self.fused:
            if name.endswith(fused.suffix):
                prefix = name[: -len(fused.suffix)]
                yield from _split(prefix, fused, tensor, name)
                return
        yield name, tensor

    def parameter_names(self, name: str) -> list[str]:
        """The parameters checkpoint tensor `name` supplies, in stacking order (several for a fused tensor)."""
        if name in self.skipped:
            return []
        for fused in self.fused:
            if name.endswith(fused.suffix):
                return [name[: -len(fused.suffix)] + suffix for suffix, _ in fused.parts]
        return [name]

    def parameter_offsets(self, name: str) -> list[tuple[str, int]]:
        """The parameters checkpoint tensor `name` supplies, each with its first row in that tensor."""
        for fused in self.fused:
            if name.endswith(fused.suffix) and name not in self.skipped:
                offsets = [0]
                for _, rows in fused.parts[:-1]:
                    offsets.append(offsets[-1] + rows)
                return list(zip(self.parameter_names(name), offsets, strict=True))
        return [(param, 0) for param in self.parameter_names(name)]


def _split(
    prefix: str, fused: FusedTensor, tensor: CheckpointTensor, name: str
) -> Iterator[tuple[str, CheckpointTensor]]:
    rows = sum(size for _, size in fused.parts)
    if tensor.shape[0] != rows:
        raise ValueError(f"{name}: fused tensor has {tensor.shape[0]} rows, expected {rows}")
    offset = 0
    for suffix, size in fused.parts:
        yield prefix + suffix, tensor.narrow(0, offset, size)
        offset += size
