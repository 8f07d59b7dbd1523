"""CUDA graphs for decode and draft-verifying steps: captured at Warmup per shape, replayed with the step padded up.

A step whose requests each run a few tokens (one to decode; the last token and its drafts to verify them) has
shapes fixed by its rows and tokens per row alone when the attention backend prepares it on the device
(`supports_cuda_graphs`), so its kernels can be recorded once and replayed without per-kernel launch cost. The
graphs read token inputs held here and attention metadata held at fixed addresses by
`layers/attention/static_metadata.py`, whose padding writes into the reserved block and whose outputs are dropped.
Steps no captured shape holds (prompt chunks, large batches) run eagerly.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.execution.batch import StepBatch
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.protocol import ExecutionPlan, PlannedStep
from tandem_server.layers.attention import StaticStepMetadata, UniformShape
from tandem_server.models.config import ModelSpec
from tandem_server.models.registry import CausalLM

logger = logging.getLogger(__name__)

# Eager runs on a side stream before capture, so lazily initialised kernels (Triton JIT, cuBLAS) are ready.
_WARM_RUNS_BEFORE_CAPTURE = 2


def graph_shapes(sizes: Sequence[int], max_drafts: int, max_drafting_requests: int) -> tuple[UniformShape, ...]:
    """The decode shape of every size, and, when requests draft, the verifying shape (one token more than the most
    drafts) of every size up to the first that holds the most requests a drafting step may carry."""
    shapes = [UniformShape(size, 1) for size in sizes]
    if max_drafts > 0 and max_drafting_requests > 0:
        ascending = sorted(set(sizes))
        drafting = [size for size in ascending if size < max_drafting_requests]
        drafting += [size for size in ascending if size >= max_drafting_requests][:1]
        shapes += [UniformShape(size, 1 + max_drafts) for size in drafting]
    return tuple(sorted(set(shapes), key=lambda shape: (shape.tokens, shape.tokens_per_row)))


def model_graph_shapes(
    spec: ModelSpec, sizes: Sequence[int], max_drafts: int, max_drafting_requests: int
) -> tuple[UniformShape, ...]:
    """`graph_shapes` for a model. Latent attention (`spec.latent_dim`) expands verifying rows from the host's slot
    lists, which a captured graph has none of: such a model captures its decode shapes only and verifies eagerly."""
    drafts = max_drafts if spec.latent_dim is None else 0
    return graph_shapes(sizes, drafts, max_drafting_requests)


def drafting_shapes(shapes: Sequence[UniformShape]) -> tuple[UniformShape, ...]:
    """The shapes of steps that draft: those with no more rows than the widest shapes (none when none is wider
    than a decode). A draft model runs its catch-up and single-token passes in them."""
    verifying = [shape.rows for shape in shapes if shape.tokens_per_row > 1]
    if not verifying:
        return ()
    return tuple(shape for shape in shapes if shape.rows <= max(verifying))


def fitting_shape(shapes: Sequence[UniformShape], num_rows: int, max_query_len: int) -> UniformShape | None:
    """The shape of fewest tokens that holds `num_rows` requests of up to `max_query_len` tokens; None when none
    does. `shapes` are in ascending tokens."""
    return next((shape for shape in shapes if shape.holds(num_rows, max_query_len)), None)


def token_rows(query_lens: Sequence[int], tokens_per_row: int) -> list[int] | None:
    """The row of each of a step's tokens in the uniform layout; None when it is the step's own layout."""
    if all(length == tokens_per_row for length in query_lens):
        return None
    return [row * tokens_per_row + index for row, length in enumerate(query_lens) for index in range(length)]


@dataclass(frozen=True)
class StepBuffers:
    """Fixed-address inputs of the captured graphs, sized for the largest shape."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: StaticStepMetadata

    @classmethod
    def allocate(
        cls, shapes: tuple[UniformShape, ...], max_positions: int, cache: KVCache, device: torch.device
    ) -> StepBuffers:
        """Buffers for `shapes` over contexts of up to `max_positions` tokens."""
        max_tokens = max(shape.tokens for shape in shapes)
        return cls(
            input_ids=torch.zeros(max_tokens, dtype=torch.long, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.long, device=device),
            attention=StaticStepMetadata.allocate(
                shapes, max_positions, cache.block_size, cache.reserved_block, device
            ),
        )

    def fill(self, batch: StepBatch, shape: UniformShape) -> torch.Tensor | None:
        """Copies a step into `shape`'s layout, padding tokens as token 0 at position 0; returns the row of each of
        the step's tokens (None: rows [0, n) in order)."""
        paged = batch.metadata.paged
        rows = token_rows(paged.query_lens, shape.tokens_per_row)
        moved = to_device(torch.tensor(rows, dtype=torch.long), self.input_ids.device) if rows is not None else None
        if moved is None:
            count = batch.input_ids.shape[0]
            self.input_ids[:count].copy_(batch.input_ids, non_blocking=True)
            self.positions[:count].copy_(batch.positions, non_blocking=True)
            self.input_ids[count : shape.tokens] = 0
            self.positions[count : shape.tokens] = 0
        else:
            self.input_ids[: shape.tokens] = 0
            self.positions[: shape.tokens] = 0
            self.input_ids.index_copy_(0, moved, batch.input_ids)
            self.positions.index_copy_(0, moved, batch.positions)
        self.attention.fill(batch.metadata, shape, moved)
        return moved

    def view(self, shape: UniformShape) -> StepBatch:
        """`shape`'s rows as the step batch its graph runs."""
        tokens_per_row = shape.tokens_per_row
        return StepBatch(
            input_ids=self.input_ids[: shape.tokens],
            positions=self.positions[: shape.tokens],
            metadata=self.attention.view(shape),
            last_rows=tuple((row + 1) * tokens_per_row - 1 for row in range(shape.rows)),
        )


class StepGraphs:
    """One captured forward pass per shape, sharing a memory pool; replays the steps a shape holds."""

    def __init__(self, model: CausalLM, cache: KVCache, shapes: Sequence[UniformShape], device: torch.device) -> None:
        self.shapes = tuple(sorted(shapes, key=lambda shape: (shape.tokens, shape.tokens_per_row)))
        self._model = model
        self._cache = cache
        self._device = device
        self._buffers = StepBuffers.allocate(self.shapes, model.spec.max_position_embeddings, cache, device)
        self.graphs: dict[UniformShape, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # Capture and replay run on this rank's own stream (never torch's process-wide capture stream, which
        # lives on whichever device first asked for it).
        self._stream = torch.cuda.Stream(device)

    def capture(self) -> None:
        """Records the model's forward pass for every shape, largest first so smaller graphs reuse its pool."""
        pool = None
        for shape in reversed(self.shapes):
            batch = self._buffers.view(shape)
            with self._on_own_stream():
                for _ in range(_WARM_RUNS_BEFORE_CAPTURE):
                    forward_step(self._model, batch, self._cache.layers)
            graph = torch.cuda.CUDAGraph()
            # Whatever the backend prepares is captured with the graph and replayed with it.
            with torch.cuda.graph(graph, pool=pool, stream=self._stream):
                hidden = forward_step(self._model, batch, self._cache.layers)
            pool = graph.pool()
            self.graphs[shape] = (graph, hidden)
        described = ", ".join(f"{shape.rows}x{shape.tokens_per_row}" for shape in self.shapes)
        logger.info("captured CUDA graphs for steps of (requests x tokens each) %s", described)

    def holds(self, batch: StepBatch) -> bool:
        """Whether a captured shape holds the step."""
        paged = batch.metadata.paged
        return fitting_shape(self.shapes, paged.num_seqs, paged.max_query_len) is not None

    def run(self, batch: StepBatch) -> torch.Tensor:
        """Hidden states of the step's tokens, in its order, from the smallest graph that holds it (see `holds`)."""
        paged = batch.metadata.paged
        shape = fitting_shape(self.shapes, paged.num_seqs, paged.max_query_len)
        if shape is None:
            raise ValueError("no captured graph holds this step")
        rows = self._buffers.fill(batch, shape)
        graph, hidden = self.graphs[shape]
        with self._on_own_stream():
            graph.replay()
        if rows is None:
            return hidden[: batch.input_ids.shape[0]]
        return hidden.index_select(0, rows)

    @contextlib.contextmanager
    def _on_own_stream(self) -> Iterator[None]:
        # The own stream starts after everything queued so far and what follows waits for it.
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            yield
        current.wait_stream(self._stream)


class CudaGraphExecutor:
    """Replays the captured graph of the smallest shape that holds a step; steps none holds run otherwise."""

    name = "cuda-graphs"

    def __init__(self, model: CausalLM, device: torch.device) -> None:
        self._model = model
        self._device = device
        # The graphs captured at the latest Warmup; None before it, or when it named no shape.
        self.graphs: StepGraphs | None = None

    def prepare(self, cache: KVCache, plan: ExecutionPlan) -> None:
        """Captures a graph of every shape the plan names, over `cache`."""
        self.graphs = None
        if plan.graph_shapes:
            graphs = StepGraphs(self._model, cache, plan.graph_shapes, self._device)
            graphs.capture()
            self.graphs = graphs

    def serves(self, step: PlannedStep) -> bool:
        # A captured graph replays the base model on token embeddings at sequence positions: rows under an adapter,
        # on given embeddings or at three-axis rotary positions run eagerly.
        return self.graphs is not None and step.batch.runs_base_model and self.graphs.holds(step.batch)

    def run(self, step: PlannedStep) -> torch.Tensor:
        if self.graphs is None:
            raise RuntimeError("invariant: only steps a captured graph holds run here")
        return self.graphs.run(step.batch)

    def stop(self) -> None:
        """Nothing runs beside the steps."""


def profile_graph_bytes(
    model: CausalLM, geometry: CacheGeometry, shapes: tuple[UniformShape, ...], device: torch.device
) -> int:
    """Device memory the graphs hold: the largest shape of each width (smaller ones share their pool) captured
    into a two-block cache, measured, then released."""
    if not shapes:
        return 0
    largest = {shape.tokens_per_row: shape for shape in sorted(shapes, key=lambda shape: shape.rows)}
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    probe = KVCache(geometry, 1, device)
    graphs = StepGraphs(model, probe, tuple(largest.values()), device)
    graphs.capture()
    torch.cuda.synchronize(device)
    held = torch.cuda.memory_reserved(device) - before - probe.nbytes
    del graphs, probe
    torch.cuda.empty_cache()
    return max(0, held)
