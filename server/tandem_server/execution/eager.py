"""Eager execution: the attention backend prepares the step's metadata, then the model runs operator by operator.
It serves every step, so the runner tries it last: the only executor that applies LoRA adapters and given input
embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.execution.batch import StepBatch
from tandem_server.execution.kv_cache import KVCache
from tandem_server.execution.protocol import ExecutionPlan, PlannedStep
from tandem_server.layers.attention import LayerCache
from tandem_server.models.registry import CausalLM


def forward_step(model: CausalLM, batch: StepBatch, layers: Sequence[LayerCache]) -> torch.Tensor:
    """Final hidden states of the batch, run eagerly; its keys and values land in `layers`."""
    return run_prepared(model, PlannedStep(batch, layers, model.backend))


def run_prepared(model: CausalLM, step: PlannedStep) -> torch.Tensor:
    prepared, batch = step.prepared, step.batch
    inputs = (batch.input_ids, batch.positions, prepared.layers, prepared.metadata, step.states, batch.embeddings)
    if batch.lora is None:
        return model(*inputs)
    with batch.lora.applied():
        return model(*inputs)


class EagerExecutor:
    """Runs any step with the model's own modules."""

    name = "eager"

    def __init__(self, model: CausalLM) -> None:
        self._model = model

    def prepare(self, cache: KVCache, plan: ExecutionPlan) -> None:
        """Nothing to build: eager steps need only the cache."""

    def serves(self, step: PlannedStep) -> bool:
        return True

    def run(self, step: PlannedStep) -> torch.Tensor:
        return run_prepared(self._model, step)

    def stop(self) -> None:
        """Nothing runs beside the steps."""
