"""`--torch-compile` for decode steps: a step whose every row decodes through the decode mirror runs the model's
whole forward pass as one compiled graph (Inductor), attention included.

Compiling each layer's stages around an eager attention leaves two compiled regions per layer, and entering one
costs about what its fused operators save. A mirror decode step is plain tensor work (write the step's K/V at their
slots, copy the positions a mirror row lacks, one SDPA over the mirror's rows), so it traces whole: measured in one
process on the embedded model (gguf weights, 2 cores, one request), 8.5 ms per step against 12.9 ms eager.

Every per-step size (rows, context, mirror fills, the mirror's rows and positions) is marked dynamic, so the graphs
differ where torch specialises sizes of 1 (one row with one fill: steady decode; one row with several: its first
decode, or a grown mirror) and where a weight format's row threshold picks another GEMM. Every row count's graphs
compile before Warmup returns (`--torch-compile warmup`), or the one-row graphs compile on a thread beside serving
(`background`, the CPU's default), which runs only between steps (`background_compile.py`); serving steps only run
what has compiled (torch's run-only mode), so a step no graph fits runs eagerly rather than compiling while requests
wait.

Before each step torch checks the graphs' guards; on the whole model they number thousands, mostly on module
attributes, and took 0.8 ms of a 9 ms step. The module tree is fixed once the shard has loaded (formats, packed
GEMMs and dense copies are all set before Warmup), so its guards are dropped and only those on the step's inputs
(ids, positions, metadata, caches) stay: 0.2 ms. The graphs are compiled through a code object of this model's own,
so no other model of the same class, whose module guards nobody checks, can ever run them.

A quantized model's one-row graphs (single streams) compile with its weights as constants of the graph (Inductor's
freezing) and with autotuning, so each int4 GEMM runs the faster of torch's kernel and Inductor's own weight-only
int4 kernel, which freezing makes available: on the embedded GGUF Inductor's won all four GEMM shapes at one row, and
a decode step took 9.4-10.4 ms against 11.2-12.2 ms. The graphs then hold the weights in that kernel's layout (a
served shard took 41 MiB more once ready); Warmup logs how much the process grew while the graphs compiled. Steps
of more rows keep torch's kernel, which autotuning chose at two rows anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tandem_server.config import CompileMode
from tandem_server.execution.background_compile import BackgroundCompile, StepGate
from tandem_server.execution.batch import ScheduledSpan, StepBatch, build_step_batch
from tandem_server.execution.compiled_layers import (
    compile_layers,
    require_cpp_compiler,
    warm_compiled_layers,
    warmup_rows,
)
from tandem_server.execution.kv_cache import KVCache
from tandem_server.execution.protocol import ExecutionPlan, PlannedStep
from tandem_server.freed_memory import return_freed_memory
from tandem_server.layers.attention import AttentionBackend, KeepsStepState, LayerCache, PreparedStep
from tandem_server.layers.attention.metadata import AttentionMetadata
from tandem_server.layers.attention.torch_backend import TorchAttentionBackend
from tandem_server.layers.attention.torch_decode_mirror import MirroredLayerCache
from tandem_server.layers.attention.torch_metadata import TorchAttentionMetadata
from tandem_server.layers.moe.quantized_experts import keep_out_of_compiled_graphs
from tandem_server.metrics import CompilationState
from tandem_server.models.registry import CausalLM
from tandem_server.quant.dense_copies import has_quantized_gemms

logger = logging.getLogger(__name__)

_STATM = Path("/proc/self/statm")
# A warm-up decode step's context length: its keys all land in the reserved block.
_WARMUP_CONTEXT = 4


class DecodeGraph:
    """The model's forward pass compiled for mirror decode steps; `steps` counts the steps it ran."""

    def __init__(self, model: CausalLM) -> None:
        self._model = model
        forward = _own_forward(model)
        # The code object torch keeps this model's decode graphs on.
        self.code = forward.__code__
        keep_out_of_compiled_graphs()
        self._compiled = torch.compile(
            forward,
            dynamic=None,
            options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
        )
        # Until Warmup has compiled the graphs, nothing runs compiled; then only what it compiled.
        self._run = model.forward
        self._freezes_one_row = has_quantized_gemms(model)
        self._marked_mirror: torch.Tensor | None = None
        self.steps = 0
        # The row counts of the decode steps compiled so far (steps of counts between two of them share a graph).
        self.compiled_rows: tuple[int, ...] = ()

    @staticmethod
    def serves(metadata: AttentionMetadata) -> bool:
        """Whether the step `metadata` describes is one the graph runs: decodes only, every one on the mirror."""
        if not isinstance(metadata, TorchAttentionMetadata) or metadata.prefills:
            return False
        decode = metadata.decode
        return decode is not None and decode.every_row and decode.mirror is not None

    def forward(self, batch: StepBatch, prepared: PreparedStep) -> torch.Tensor:
        """Final hidden states of a step `serves` accepts; its keys and values land in the cache and the mirror."""
        self._mark_dynamic(batch, prepared)
        self.steps += 1
        return self._run(batch.input_ids, batch.positions, prepared.layers, prepared.metadata)

    def _mark_dynamic(self, batch: StepBatch, prepared: PreparedStep) -> None:
        """Marks every per-step size of a step `serves` accepts dynamic."""
        metadata = prepared.metadata
        if not isinstance(metadata, TorchAttentionMetadata) or metadata.decode is None:
            raise TypeError("invariant: the decode graph runs only steps it serves")
        decode = metadata.decode
        for tensor in (batch.input_ids, batch.positions, metadata.slot_mapping, decode.query_rows):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        for tensor in (decode.key_slots, decode.key_mask):
            # Rows and context; torch takes a dimension's index as it stands (a mark on -1 marked nothing).
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            torch._dynamo.maybe_mark_dynamic(tensor, tensor.dim() - 1)
        if decode.mirror is not None:
            torch._dynamo.maybe_mark_dynamic(decode.mirror.sources, 0)
            torch._dynamo.maybe_mark_dynamic(decode.mirror.targets, 0)
        self._mark_mirror(prepared.layers)

    def _mark_mirror(self, layers: Sequence[LayerCache]) -> None:
        # The mirror's tensors live until it regrows: each new set is marked once.
        first = layers[0]
        if not isinstance(first, MirroredLayerCache) or first.mirror_key is self._marked_mirror:
            return
        for layer in layers:
            if isinstance(layer, MirroredLayerCache):
                for tensor in (layer.mirror_key, layer.mirror_value):
                    torch._dynamo.maybe_mark_dynamic(tensor, 0)
                    torch._dynamo.maybe_mark_dynamic(tensor, 1)
        self._marked_mirror = first.mirror_key

    def compile_at_warmup(self, cache: KVCache, max_batch_requests: int) -> None:
        """Compiles, before Warmup returns, every graph decode steps of up to `max_batch_requests` rows need; from
        here on no step compiles."""
        backend = self._model.backend
        try:
            self._compile_steps(cache, max_batch_requests, backend, lambda: False)
        finally:
            # The made-up requests leave nothing in the served backend's decode mirror.
            if isinstance(backend, KeepsStepState):
                backend.clear()
            self._run = torch._dynamo.run(self._compiled)

    def compile_in_background(self, cache: KVCache, gate: StepGate) -> BackgroundCompile | None:
        """Starts compiling the one-row graphs (single streams' decode steps) on a thread that yields to every step
        `gate` holds; each serves as soon as it is compiled, and steps no graph fits run eagerly. None when no step
        could run a graph: only decodes on the torch backend's decode mirror do.

        Only one row compiles: a step's fixed cost between operators, which the graph removes, is most of a
        one-row step and little of a batched one (on the embedded model, 2 cores, compiling every row count made 32
        streams 2 % faster for about 300 MiB more memory and twice the compile time).

        The thread places its made-up requests in a decode mirror of its own: the backend's mirror belongs to the
        steps being served."""
        served = self._model.backend
        if not isinstance(served, TorchAttentionBackend) or served.mirror is None:
            logger.info("torch.compile: nothing compiles, since decode graphs need the torch backend's decode mirror")
            return None
        backend = TorchAttentionBackend(served.mirror.budget_bytes)
        backend.bind_cache(cache.layers)
        self._run = torch._dynamo.run(self._compiled)

        def compile_all(should_stop: Callable[[], bool]) -> None:
            with torch.inference_mode():
                self._compile_steps(cache, 1, backend, should_stop)

        compiling = BackgroundCompile("decode-graph-compile", compile_all, gate)
        compiling.start()
        return compiling

    def _compile_steps(
        self, cache: KVCache, max_batch_requests: int, backend: AttentionBackend, should_stop: Callable[[], bool]
    ) -> None:
        """Runs compiling decode steps of made-up requests in the reserved block through `backend`'s mirror.

        One request decodes twice (its first decode fills several mirror positions, its next one), then steps of
        each row count `warmup_rows` names, so each row threshold of the weight formats is crossed. `compiled_rows`
        starts empty and gains each row count once its steps have compiled."""
        started, resident_before = time.perf_counter(), _resident_bytes()
        steps: list[tuple[tuple[int, int], ...]] = [((0, _WARMUP_CONTEXT),), ((0, _WARMUP_CONTEXT + 1),)]
        steps += [
            tuple((request, _WARMUP_CONTEXT) for request in range(rows)) for rows in warmup_rows(max_batch_requests)[1:]
        ]
        compiled = 0
        self.compiled_rows = ()
        for index, rows in enumerate(steps):
            if should_stop():
                break
            frozen = self._freezes_one_row and len(rows) == 1
            with _frozen_autotuned() if frozen else contextlib.nullcontext():
                served = self._warm_step(cache, rows, backend)
            if not served:
                logger.info(
                    "torch.compile: decode steps of %d rows or more run without the decode graph (no "
                    "decode mirror holds them)",
                    len(rows),
                )
                break
            compiled += 1
            # A row count serves once its last step (one row has two: several mirror fills, then one) compiled.
            if index + 1 == len(steps) or len(steps[index + 1]) != len(rows):
                self.compiled_rows = (*self.compiled_rows, len(rows))
        # The compile's transient allocations are freed by now: their pages go back (240 MiB on the embedded model).
        return_freed_memory()
        logger.info(
            "torch.compile: decode-step graphs for %s rows compiled in %.1fs (%d warm-up steps)%s; the process grew "
            "by %s",
            ", ".join(map(str, self.compiled_rows)) or "no",
            time.perf_counter() - started,
            compiled,
            ", one-row graphs with frozen weights and autotuned GEMMs" if self._freezes_one_row else "",
            _difference_mib(resident_before, _resident_bytes()),
        )

    def _warm_step(self, cache: KVCache, rows: Sequence[tuple[int, int]], backend: AttentionBackend) -> bool:
        """Runs one compiling decode step of (request id, context length) rows; False when the graph would not
        serve it."""
        # A block per position is more than any context needs; the batch keeps only the blocks it reads.
        blocks = [cache.reserved_block] * max(context_len for _, context_len in rows)
        spans = [ScheduledSpan([0], context_len - 1, blocks, request_id) for request_id, context_len in rows]
        batch = build_step_batch(spans, cache.block_size, cache.layers[0].key.device)
        prepared = backend.prepare(batch.metadata, cache.layers)
        if not self.serves(prepared.metadata):
            return False
        self._mark_dynamic(batch, prepared)
        self._compiled(batch.input_ids, batch.positions, prepared.layers, prepared.metadata)
        return True


class CompiledExecutor:
    """`--torch-compile`: runs the decode steps a compiled graph serves. At Warmup (`warmup`) the layer stages and
    the decode graphs of every row count compile before it returns; `background` starts the one-row decode graphs'
    compile beside serving."""

    name = "compiled-decode"

    def __init__(self, model: CausalLM, mode: CompileMode, gate: StepGate) -> None:
        if mode is CompileMode.OFF:
            raise ValueError("invariant: nothing compiles with --torch-compile off")
        self._model = model
        self._mode = mode
        self._gate = gate
        if mode is CompileMode.WARMUP:
            require_cpp_compiler()
            logger.info("torch.compile: the stages of %d decoder layers compile at Warmup", compile_layers(model))
        self.graph = DecodeGraph(model)
        self.background: BackgroundCompile | None = None

    def prepare(self, cache: KVCache, plan: ExecutionPlan) -> None:
        self.stop()
        if self._mode is CompileMode.WARMUP:
            warm_compiled_layers(self._model, cache, plan.max_batch_tokens)
            self.graph.compile_at_warmup(cache, plan.max_batch_requests)
        else:
            self.background = self.graph.compile_in_background(cache, self._gate)

    def serves(self, step: PlannedStep) -> bool:
        # The compiled graphs run the base model on token embeddings at sequence positions: rows under an adapter, on
        # given embeddings or at three-axis rotary positions run eagerly.
        return step.batch.runs_base_model and self.graph.serves(step.prepared.metadata)

    def run(self, step: PlannedStep) -> torch.Tensor:
        return self.graph.forward(step.batch, step.prepared)

    def stop(self) -> None:
        """Stops a background compile: it compiles into the cache about to be replaced."""
        if self.background is not None:
            self.background.stop()
            self.background = None

    def compilation(self) -> CompilationState:
        background = self.background
        return CompilationState(self.graph.compiled_rows, background is not None and background.running)


def _frozen_autotuned() -> contextlib.AbstractContextManager[None]:
    """Inductor's settings while a graph compiles: module tensors become constants of the graph (Dynamo reads
    `freezing` while it traces, so the patch must cover the call that compiles), and each GEMM gets the fastest
    kernel measured among those its operands allow."""
    return torch._inductor.config.patch(freezing=True, max_autotune=True)


def _resident_bytes() -> int | None:
    """The process's resident memory, where /proc tells it."""
    try:
        pages = int(_STATM.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _difference_mib(before: int | None, after: int | None) -> str:
    return "an unknown amount" if before is None or after is None else f"{(after - before) / 2**20:.1f} MiB"


def _own_forward(model: CausalLM) -> types.MethodType:
    """`model.forward` bound through a copy of its code object: torch keeps compiled graphs per code object, so the
    graphs compiled through it serve this model only."""
    function = type(model).forward
    code = function.__code__.replace(co_name=f"{function.__name__}_{id(model):x}")
    own = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    return types.MethodType(own, model)
