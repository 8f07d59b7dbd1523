"""How checkpoint tensor names relate to model parameters beyond a one-to-one match."""

from __future__ import annotations

import re
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
class Renamed:
    """Checkpoint names in which the regular expression `pattern` matches name the parameter `re.sub` gives."""

    pattern: str
    replacement: str


@dataclass(frozen=True)
class ExpertStack:
    """A checkpoint tensor `[experts, rows, columns]` (named by its suffix) holding one matrix per expert, each the
    parts stacked along its rows in equal shares: transformers' own `gate_up_proj` and `down_proj` of an experts
    module. Each part's suffix names its expert's parameter with `{expert}`."""

    suffix: str
    num_experts: int
    parts: tuple[str, ...]

    def names(self, prefix: str) -> list[str]:
        return [prefix + part.format(expert=e) for e in range(self.num_experts) for part in self.parts]


@dataclass(frozen=True)
class CheckpointLayout:
    """Tensors to skip (a tied head's duplicate; every tensor under a skipped prefix, such as the multi-token
    prediction layers served models never run), names to rewrite, and fused tensors and expert stacks to split before
    per-rank slicing; a name is rewritten first, then skipped or split."""

    skipped: frozenset[str] = frozenset()
    skipped_prefixes: tuple[str, ...] = ()
    # When set, only tensors named under one of these prefixes are read (before renaming): a multimodal checkpoint's
    # text part, whose encoders and projectors are skipped.
    kept_prefixes: tuple[str, ...] = ()
    fused: tuple[FusedTensor, ...] = field(default=())
    renamed: tuple[Renamed, ...] = field(default=())
    expert_stacks: tuple[ExpertStack, ...] = field(default=())

    def parameter_tensors(self, name: str, tensor: CheckpointTensor) -> Iterator[tuple[str, CheckpointTensor]]:
        """The `(parameter name, unread tensor)` pairs that checkpoint tensor `name` supplies."""
        if not self._keeps(name):
            return
        name = self._renamed(name)
        if self._skips(name):
            return
        for fused in self.fused:
            if name.endswith(fused.suffix):
                prefix = name[: -len(fused.suffix)]
                yield from _split(prefix, fused, tensor, name)
                return
        for stack in self.expert_stacks:
            if name.endswith(stack.suffix):
                yield from _split_experts(name[: -len(stack.suffix)], stack, tensor, name)
                return
        yield name, tensor

    def parameter_names(self, name: str) -> list[str]:
        """The parameters checkpoint tensor `name` supplies, in stacking order (several for a fused tensor)."""
        if not self._keeps(name):
            return []
        name = self._renamed(name)
        if self._skips(name):
            return []
        for fused in self.fused:
            if name.endswith(fused.suffix):
                return [name[: -len(fused.suffix)] + suffix for suffix, _ in fused.parts]
        for stack in self.expert_stacks:
            if name.endswith(stack.suffix):
                return stack.names(name[: -len(stack.suffix)])
        return [name]

    def parameter_offsets(self, name: str) -> list[tuple[str, int]]:
        """The parameters checkpoint tensor `name` supplies, each with its first row in that tensor (fused tensors;
        an expert stack's parts are not rows of one matrix, and quantized checkpoints of experts are refused)."""
        renamed = self._renamed(name)
        for fused in self.fused:
            if renamed.endswith(fused.suffix) and self._keeps(name) and not self._skips(renamed):
                offsets = [0]
                for _, rows in fused.parts[:-1]:
                    offsets.append(offsets[-1] + rows)
                return list(zip(self.parameter_names(name), offsets, strict=True))
        return [(param, 0) for param in self.parameter_names(name)]

    def _keeps(self, name: str) -> bool:
        return not self.kept_prefixes or name.startswith(self.kept_prefixes)

    def _skips(self, name: str) -> bool:
        return name in self.skipped or name.startswith(self.skipped_prefixes)

    def _renamed(self, name: str) -> str:
        for rule in self.renamed:
            name = re.sub(rule.pattern, rule.replacement, name)
        return name


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


def _split_experts(
    prefix: str, stack: ExpertStack, tensor: CheckpointTensor, name: str
) -> Iterator[tuple[str, CheckpointTensor]]:
    shape = tuple(tensor.shape)
    if len(shape) != 3 or shape[0] != stack.num_experts or shape[1] % len(stack.parts):
        raise ValueError(
            f"{name}: expert stack has shape {shape}, expected [{stack.num_experts}, rows, columns] with rows a "
            f"multiple of {len(stack.parts)}"
        )
    rows = shape[1] // len(stack.parts)
    for expert in range(stack.num_experts):
        matrix = tensor.select(expert)
        for index, part in enumerate(stack.parts):
            yield prefix + part.format(expert=expert), matrix.narrow(0, index * rows, rows)
