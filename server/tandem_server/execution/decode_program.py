"""The steady one-row decode step as a function of plain tensors, which AOTInductor compiles ahead of time
(`decode_package.py`).

A single stream's decode step, once its request holds a decode-mirror row, copies one position into the mirror and
attends over the mirror's row: every input is a tensor, and the sizes that change between steps (the context, the
paged cache's and the mirror's allocations) are dimensions of those tensors. `DecodeProgram` takes exactly those
tensors, rebuilds the torch backend's metadata from them and runs the model's forward pass, so `torch.export` can
trace it once for every context length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch import nn

from tandem_server.execution.batch import StepBatch
from tandem_server.layers.attention import PreparedStep
from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout
from tandem_server.layers.attention.torch_decode_mirror import MirroredLayerCache
from tandem_server.layers.attention.torch_metadata import DecodeGroup, MirrorFill, TorchAttentionMetadata
from tandem_server.models.causal_lm import CausalLM

_Field = TypeVar("_Field")
# The positions a steady decode step copies into its mirror row: the one it adds.
STEADY_FILLS = 1


class StepTensors(NamedTuple, Generic[_Field]):
    """The step's own tensors, as the batch and the torch backend's decode group hold them (or, for `torch.export`,
    each one's dynamic dimensions); the program takes them as a list in this order."""

    input_ids: _Field
    positions: _Field
    slot_mapping: _Field
    key_slots: _Field
    key_mask: _Field
    mirror_sources: _Field
    mirror_targets: _Field


class DecodeProgram(nn.Module):
    """The model's forward pass over one steady mirror decode step, from the step's tensors alone."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        step_tensors: list[torch.Tensor],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        mirror_keys: list[torch.Tensor],
        mirror_values: list[torch.Tensor],
    ) -> torch.Tensor:
        step = StepTensors(*step_tensors)
        rows = step.input_ids.shape[0]
        # The torch backend's mirror decode reads the slot mapping and the decode group, never the paged layout.
        paged = PagedLayout(
            query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
            seq_lens=step.key_mask.sum(dim=-1, dtype=torch.int32).view(rows),
            block_tables=step.key_slots,
            max_query_len=1,
            max_seq_len=step.key_slots.shape[1],
        )
        decode = DecodeGroup(
            query_rows=torch.arange(rows),
            key_slots=step.key_slots,
            key_mask=step.key_mask,
            mirror=MirrorFill(step.mirror_sources, step.mirror_targets),
            every_row=True,
        )
        metadata = TorchAttentionMetadata(slot_mapping=step.slot_mapping, paged=paged, decode=decode)
        layers = [
            MirroredLayerCache(key=key, value=value, mirror_key=mirror_key, mirror_value=mirror_value)
            for key, value, mirror_key, mirror_value in zip(keys, values, mirror_keys, mirror_values, strict=True)
        ]
        return self.model(step.input_ids, step.positions, layers, metadata)


def is_steady_single_decode(batch: StepBatch, metadata: AttentionMetadata) -> bool:
    """Whether the step is the program's: one request decoding on its mirror row, which lacks only the new position."""
    return is_single_mirror_decode(batch, metadata) and _mirror_decode(metadata)[1].sources.shape[0] == STEADY_FILLS


def is_single_mirror_decode(batch: StepBatch, metadata: AttentionMetadata) -> bool:
    """Whether the step is one request decoding on its mirror row, which lacks the new position and possibly earlier
    ones (a row placed at this step lacks the whole context): `steady_program_arguments` makes it the program's."""
    if not isinstance(metadata, TorchAttentionMetadata) or metadata.prefills or batch.input_ids.shape[0] != 1:
        return False
    decode = metadata.decode
    return decode is not None and decode.every_row and decode.mirror is not None and decode.mirror.sources.shape[0] > 0


def steady_program_arguments(batch: StepBatch, prepared: PreparedStep) -> tuple[Any, ...]:
    """`DecodeProgram`'s arguments for a step `is_single_mirror_decode` accepts. A row that lacks more than the new
    position first gets the earlier ones copied from the paged cache, where earlier steps wrote them; the program
    then copies only the new position, which it writes itself."""
    metadata = prepared.metadata
    decode, fill = _mirror_decode(metadata)
    earlier = fill.sources.shape[0] - STEADY_FILLS
    layers = _mirrored(prepared.layers)
    if earlier > 0:
        for layer in layers:
            layer.copy_to_mirror(fill.sources[:earlier], fill.targets[:earlier])
    step = StepTensors(
        batch.input_ids,
        batch.positions,
        metadata.slot_mapping,
        decode.key_slots,
        decode.key_mask,
        fill.sources[earlier:],
        fill.targets[earlier:],
    )
    return (
        list(step),
        [layer.key for layer in layers],
        [layer.value for layer in layers],
        [layer.mirror_key for layer in layers],
        [layer.mirror_value for layer in layers],
    )


def _mirror_decode(metadata: AttentionMetadata) -> tuple[DecodeGroup, MirrorFill]:
    if not isinstance(metadata, TorchAttentionMetadata) or metadata.decode is None or metadata.decode.mirror is None:
        raise TypeError("invariant: the decode program runs only one-row mirror decodes")
    return metadata.decode, metadata.decode.mirror


def flat_inputs(arguments: tuple[Any, ...]) -> list[torch.Tensor]:
    """The arguments in the order a compiled program takes them: the step's tensors, then each list in turn."""
    flat: list[torch.Tensor] = []
    for argument in arguments:
        flat.extend(argument)
    return flat


def input_count(num_layers: int) -> int:
    """How many tensors the program takes for a model of `num_layers` layers."""
    return len(StepTensors._fields) + 4 * num_layers


def dynamic_shapes(num_layers: int) -> tuple[Any, ...]:
    """`torch.export`'s dynamic dimensions for `DecodeProgram`: the context, the paged cache's blocks, and the
    mirror's rows and columns. The step's one row and one fill are fixed."""
    dim = torch.export.Dim
    context = dim("context", min=2)
    blocks = dim("blocks", min=2)
    mirror_rows = dim("mirror_rows", min=1)
    mirror_columns = dim("mirror_columns", min=2)
    paged = [{0: blocks}] * num_layers
    mirrored = [{0: mirror_rows, 1: mirror_columns}] * num_layers
    step: StepTensors[dict[int, Any] | None] = StepTensors(None, None, None, {1: context}, {3: context}, None, None)
    return (list(step), paged, paged, mirrored, mirrored)


def _mirrored(layers: Sequence[Any]) -> list[MirroredLayerCache]:
    if not all(isinstance(layer, MirroredLayerCache) for layer in layers):
        raise TypeError("invariant: a mirror decode step runs on layer caches with mirror tensors")
    return list(layers)
