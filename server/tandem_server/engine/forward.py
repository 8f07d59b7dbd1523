"""One forward pass over a step's batch: the attention backend prepares its metadata, then the model runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.engine.batch import StepBatch
from tandem_server.engine.decode_graph import DecodeGraph
from tandem_server.layers.attention import LayerCache
from tandem_server.models.registry import CausalLM


def forward_step(
    model: CausalLM, batch: StepBatch, layers: Sequence[LayerCache], decode_graph: DecodeGraph | None = None
) -> torch.Tensor:
    """Final hidden states of the batch; its keys and values land in `layers`. A step `decode_graph` serves runs
    through it."""
    prepared = model.backend.prepare(batch.metadata, layers)
    if decode_graph is not None and decode_graph.serves(prepared.metadata):
        return decode_graph.forward(batch, prepared)
    return model(batch.input_ids, batch.positions, prepared.layers, prepared.metadata)
