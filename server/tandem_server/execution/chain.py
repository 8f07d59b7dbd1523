"""A model's execution: its executors, tried in order for each step, and the attention backend's state between
steps. The engine reaches the executors and the backend's lifecycle only through `Execution`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import torch

from tandem_server.config import CompileMode
from tandem_server.errors import InvalidStepError
from tandem_server.execution.background_compile import StepGate
from tandem_server.execution.batch import StepBatch
from tandem_server.execution.compiled_decode import CompiledExecutor
from tandem_server.execution.cuda_graphs import CudaGraphExecutor
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.decode_package_executor import DecodePackageExecutor
from tandem_server.execution.eager import EagerExecutor
from tandem_server.execution.kv_cache import KVCache
from tandem_server.execution.protocol import ExecutionPlan, PlannedStep, StepExecutor
from tandem_server.layers.attention import KeepsStepState, LayerCache
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool, StepStates
from tandem_server.metrics import CompilationState
from tandem_server.models.registry import CausalLM

logger = logging.getLogger(__name__)

_Executor = TypeVar("_Executor")


class Execution:
    """Runs a model's steps through the first executor that serves each; the last one serves every step."""

    def __init__(self, model: CausalLM, executors: Sequence[StepExecutor], gate: StepGate) -> None:
        if not executors or not isinstance(executors[-1], EagerExecutor):
            raise ValueError("invariant: eager execution comes last, so every step has an executor")
        self._model = model
        self.executors = tuple(executors)
        # Held by each step, so a background compile runs only between steps.
        self.gate = gate
        # A hybrid model's recurrent state, one slot per running request; allocated at `prepare`.
        self.states: RecurrentStatePool | None = None

    @classmethod
    def build(
        cls,
        model: CausalLM,
        device: torch.device,
        compile_mode: CompileMode = CompileMode.OFF,
        decode_package: DecodePackageSpec | None = None,
    ) -> Execution:
        """CUDA graphs on CUDA, then under --torch-compile the decode package (`background` with a package spec) or
        the in-process compiled decode graphs, then eager."""
        gate = StepGate()
        executors: list[StepExecutor] = []
        if model.spec.state_shapes:
            # Captured graphs and compiled decodes replay attention only; recurrent layers update their state pool.
            if compile_mode is not CompileMode.OFF or device.type == "cuda":
                logger.info("a model with recurrent state runs every step eagerly (no CUDA graphs, no --torch-compile)")
            return cls(model, [EagerExecutor(model)], gate)
        if device.type == "cuda":
            executors.append(CudaGraphExecutor(model, device))
        if compile_mode is not CompileMode.OFF and model.spec.latent_dim is not None:
            # The compiled graphs run steady decodes on the decode mirror, which latent caches do not keep.
            logger.info("--torch-compile off: multi-head latent attention decodes eagerly from its latent cache")
            compile_mode = CompileMode.OFF
        if decode_package is not None and model.spec.cache_layers is not None:
            # The exported decode program is not verified over caches whose layers differ in shape.
            logger.info("decode package off: the cache's layers differ in shape; decode graphs compile in process")
            decode_package = None
        if compile_mode is CompileMode.BACKGROUND and decode_package is not None:
            executors.append(DecodePackageExecutor(model, decode_package))
        elif compile_mode is not CompileMode.OFF:
            executors.append(CompiledExecutor(model, compile_mode, gate))
        executors.append(EagerExecutor(model))
        return cls(model, executors, gate)

    def prepare(
        self, cache: KVCache, plan: ExecutionPlan, state_dtype: torch.dtype = torch.float32, state_checkpoints: int = 0
    ) -> None:
        """Binds the backend's state and every executor to a new cache (what ran beside the old one stops first);
        a hybrid model's state pool gets a slot per request a step may run, in `state_dtype`, and
        `state_checkpoints` checkpoints."""
        self.stop()
        backend = self._model.backend
        if isinstance(backend, KeepsStepState):
            backend.bind_cache(cache.layers)
        shapes = self._model.spec.state_shapes
        self.states = None
        if shapes:
            device = cache.layers[0].key.device
            fixed = self._model.spec.state_dtypes
            self.states = RecurrentStatePool(shapes, plan.max_batch_requests, state_dtype, device, fixed)
            self.states.allocate_checkpoints(state_checkpoints)
        for executor in self.executors:
            executor.prepare(cache, plan)

    def forward(self, batch: StepBatch, layers: Sequence[LayerCache]) -> torch.Tensor:
        """The step's final hidden states, from the first executor that serves it."""
        try:
            states = self._place_states(batch)
            step = PlannedStep(batch, layers, self._model.backend, states)
            executor = next(executor for executor in self.executors if executor.serves(step))
            return executor.run(step)
        except BaseException:
            # A layer may have stopped halfway through what the backend keeps between steps: nothing kept is whole.
            self.clear()
            raise

    def restore_states(self, restores: Mapping[int, int], positions: Mapping[int, int]) -> None:
        """Starts each request of `restores` from its state checkpoint, saved after `positions[request]` tokens."""
        if restores:
            self._require_states().restore_all(restores, positions)

    def save_states(self, saves: Mapping[int, int]) -> None:
        """Copies each request's state, as its step left it, into its state checkpoint."""
        if saves:
            states = self._require_states()
            for request_id, checkpoint in saves.items():
                states.save(request_id, checkpoint)

    def _require_states(self) -> RecurrentStatePool:
        if self.states is None:
            raise InvalidStepError("a state checkpoint was named, but this model keeps no recurrent state")
        return self.states

    def forget(self, request_ids: Iterable[int]) -> None:
        """Drops what the backend and the state pool keep for requests that ended, were preempted, or arrive anew
        under a known id."""
        request_ids = list(request_ids)
        backend = self._model.backend
        if isinstance(backend, KeepsStepState):
            backend.forget(request_ids)
        if self.states is not None:
            self.states.forget(request_ids)

    def clear(self) -> None:
        """Drops everything the backend and the state pool keep for any request."""
        backend = self._model.backend
        if isinstance(backend, KeepsStepState):
            backend.clear()
        if self.states is not None:
            self.states.clear()

    def _place_states(self, batch: StepBatch) -> StepStates | None:
        """The state slots of the batch's requests; None without a pool or for a step of no request."""
        host = batch.metadata.host
        if self.states is None or host is None or not host.request_ids:
            return None
        query_lens = batch.metadata.paged.query_lens
        spans = [
            (request_id, seq_len - query_len, query_len)
            for request_id, seq_len, query_len in zip(host.request_ids, host.seq_lens, query_lens, strict=True)
        ]
        return self.states.place(spans)

    def stop(self) -> None:
        """Ends what any executor runs beside the steps."""
        for executor in self.executors:
            executor.stop()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Held while a step, Warmup or a health check runs: a background compile waits for it."""
        with self.gate.step():
            yield

    def executor(self, kind: type[_Executor]) -> _Executor | None:
        """The executor of class `kind`, when this execution runs one."""
        return next((executor for executor in self.executors if isinstance(executor, kind)), None)

    def compilation(self) -> CompilationState:
        """What --torch-compile has compiled so far; safe to read from any thread."""
        compiled = self.executor(CompiledExecutor) or self.executor(DecodePackageExecutor)
        return compiled.compilation() if compiled is not None else CompilationState((), False)
