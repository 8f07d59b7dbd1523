"""CUDA graphs for decode-only steps: captured at Warmup per batch size, replayed with the batch padded up.

A decode-only step (every request runs exactly one token) has shapes fixed by its batch size alone when the
attention backend prepares it on the device (`supports_cuda_graphs`), so its kernels can be recorded once and
replayed without per-kernel launch cost. The graphs read token inputs held here and attention metadata held at fixed
addresses by `layers/attention/static_metadata.py`, whose padding rows write into the reserved block and attend to it
alone; their outputs are dropped. Mixed and prefill steps always run eagerly.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from tandem_server.engine.batch import StepBatch
from tandem_server.engine.forward import forward_step
from tandem_server.engine.kv_cache import KVCache
from tandem_server.layers.attention import StaticDecodeMetadata, is_decode_only
from tandem_server.models.registry import CausalLM

logger = logging.getLogger(__name__)

# Eager runs on a side stream before capture, so lazily initialised kernels (Triton JIT, cuBLAS) are ready.
_WARM_RUNS_BEFORE_CAPTURE = 2


def graph_batch_size(num_requests: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size (ascending `sizes`) that holds `num_requests`; None when none does."""
    index = bisect.bisect_left(sizes, num_requests)
    return sizes[index] if index < len(sizes) else None


@dataclass(frozen=True)
class DecodeBuffers:
    """Fixed-address inputs of the captured graphs, sized for the largest batch; row i is request i."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: StaticDecodeMetadata

    @classmethod
    def allocate(cls, max_batch: int, max_positions: int, cache: KVCache, device: torch.device) -> DecodeBuffers:
        """Buffers for up to `max_batch` requests whose contexts reach `max_positions` tokens."""
        return cls(
            input_ids=torch.zeros(max_batch, dtype=torch.long, device=device),
            positions=torch.zeros(max_batch, dtype=torch.long, device=device),
            attention=StaticDecodeMetadata.allocate(
                max_batch, max_positions, cache.block_size, cache.reserved_block, device
            ),
        )

    def fill(self, batch: StepBatch, size: int) -> None:
        """Copies a decode-only batch into rows [0, n) and pads rows [n, size) with token 0 at position 0."""
        count = batch.input_ids.shape[0]
        self.input_ids[:count].copy_(batch.input_ids, non_blocking=True)
        self.positions[:count].copy_(batch.positions, non_blocking=True)
        self.input_ids[count:size] = 0
        self.positions[count:size] = 0
        self.attention.fill(batch.metadata, size)

    def view(self, size: int) -> StepBatch:
        """The first `size` rows as the step batch a graph of `size` runs."""
        return StepBatch(
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            metadata=self.attention.view(size),
            last_rows=tuple(range(size)),
        )


class DecodeGraphs:
    """One captured forward pass per batch size, sharing a memory pool; replays decode-only steps."""

    def __init__(self, model: CausalLM, cache: KVCache, sizes: Sequence[int], device: torch.device) -> None:
        self.sizes = tuple(sorted(sizes))
        self._model = model
        self._cache = cache
        self._device = device
        self._buffers = DecodeBuffers.allocate(self.sizes[-1], model.spec.max_position_embeddings, cache, device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # Capture and replay run on this rank's own stream (never torch's process-wide capture stream, which
        # lives on whichever device first asked for it).
        self._stream = torch.cuda.Stream(device)

    def capture(self) -> None:
        """Records the model's forward pass for every size, largest first so smaller graphs reuse its pool."""
        pool = None
        for size in reversed(self.sizes):
            batch = self._buffers.view(size)
            with self._on_own_stream():
                for _ in range(_WARM_RUNS_BEFORE_CAPTURE):
                    forward_step(self._model, batch, self._cache.layers)
            graph = torch.cuda.CUDAGraph()
            # Whatever the backend prepares is captured with the graph and replayed with it.
            with torch.cuda.graph(graph, pool=pool, stream=self._stream):
                hidden = forward_step(self._model, batch, self._cache.layers)
            pool = graph.pool()
            self._graphs[size] = (graph, hidden)
        logger.info("captured CUDA graphs for decode batch sizes %s", ",".join(map(str, self.sizes)))

    def run(self, batch: StepBatch) -> torch.Tensor | None:
        """Hidden states of a decode-only batch from the smallest fitting graph; None when no graph fits."""
        if not is_decode_only(batch.metadata):
            return None
        # One token per request in a decode-only step.
        count = batch.input_ids.shape[0]
        size = graph_batch_size(count, self.sizes)
        if size is None:
            return None
        self._buffers.fill(batch, size)
        graph, hidden = self._graphs[size]
        with self._on_own_stream():
            graph.replay()
        return hidden[:count]

    @contextlib.contextmanager
    def _on_own_stream(self) -> Iterator[None]:
        # The own stream starts after everything queued so far and what follows waits for it.
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            yield
        current.wait_stream(self._stream)
