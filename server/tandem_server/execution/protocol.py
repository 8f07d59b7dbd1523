"""How a step's forward pass runs: the executors the runner tries in order, and the step they see.

An executor may serve only some steps (CUDA graphs: the shapes captured; compiled decode: decodes on the torch
backend's decode mirror); eager execution serves every step, so it comes last. Each is prepared at Warmup over the
new KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from tandem_server.execution.batch import StepBatch
from tandem_server.execution.kv_cache import KVCache
from tandem_server.layers.attention import AttentionBackend, LayerCache, PreparedStep, UniformShape
from tandem_server.layers.recurrent.state_pool import StepStates


@dataclass(frozen=True)
class ExecutionPlan:
    """What Warmup tells every executor: the largest step the router schedules and the shapes to capture."""

    max_batch_tokens: int
    max_batch_requests: int
    # CUDA: the step shapes captured as graphs (none on the CPU, or without --cuda-graphs).
    graph_shapes: tuple[UniformShape, ...] = ()


@dataclass
class PlannedStep:
    """One step's batch and caches; the attention backend's metadata for it is built once, by the first executor
    that reads `prepared`. `states`: a hybrid model's recurrent state slots for the step's requests."""

    batch: StepBatch
    layers: Sequence[LayerCache]
    backend: AttentionBackend
    states: StepStates | None = None
    _prepared: PreparedStep | None = field(default=None, repr=False)

    @property
    def prepared(self) -> PreparedStep:
        if self._prepared is None:
            self._prepared = self.backend.prepare(self.batch.metadata, self.layers)
        return self._prepared


class StepExecutor(Protocol):
    """One way to run a step's forward pass."""

    name: str

    def prepare(self, cache: KVCache, plan: ExecutionPlan) -> None:
        """Called at each Warmup, once `cache` is allocated and before any step runs on it."""
        ...

    def serves(self, step: PlannedStep) -> bool:
        """Whether `run` can run this step; an executor that cannot apply the step's LoRA deltas declines it."""
        ...

    def run(self, step: PlannedStep) -> torch.Tensor:
        """The step's final hidden states, one row per token in its order; its keys and values land in the cache."""
        ...

    def stop(self) -> None:
        """Ends whatever the executor runs beside the steps (a background compile); called before the cache is
        replaced."""
        ...
