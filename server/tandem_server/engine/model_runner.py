"""ModelRunner: applies a Step to the request state, runs the model once, samples and stops requests."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Concatenate, ParamSpec, TypeVar

import torch

from tandem_server.config import CompileMode
from tandem_server.device_copy import to_device
from tandem_server.engine.companions import Companions
from tandem_server.engine.draft_model import DraftRow
from tandem_server.engine.draws import apply_draws
from tandem_server.engine.grid_positions import rotary_positions
from tandem_server.engine.images import ImagePiece, bidirectional_spans, input_embeddings, scheduled_pieces
from tandem_server.engine.launched import DraftedRow, LaunchedStep, PendingRow, StepSampling
from tandem_server.engine.prompt_logprobs import ScoredChunk, chunk_prompt_logprobs
from tandem_server.engine.requests import AppliedStep, RequestState, RequestTable, StepLimits
from tandem_server.engine.step import (
    PromptLogprobs,
    StepInput,
    StepOutput,
    WarmupPlan,
    WarmupResult,
)
from tandem_server.engine.timing import StepTimer
from tandem_server.engine.warmup import (
    WarmupLimits,
    blocks_for_budget,
    cpu_cache_budget,
    profile_cuda_budget,
    run_reserved_forward,
    state_checkpoints_for_budget,
)
from tandem_server.errors import InvalidStepError, NotWarmedUpError
from tandem_server.execution.batch import ScheduledSpan, StepBatch, build_step_batch
from tandem_server.execution.chain import Execution
from tandem_server.execution.cuda_graphs import drafting_shapes, model_graph_shapes, profile_graph_bytes
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.kv_offload import KvOffload, KvOffloadOptions, KvTransfer
from tandem_server.execution.protocol import ExecutionPlan
from tandem_server.freed_memory import return_freed_memory
from tandem_server.layers.moe.expert_tokens import ExpertTokenCounters
from tandem_server.layers.recurrent.state_pool import state_pool_bytes
from tandem_server.lora import LoraLimits, LoraRegistry
from tandem_server.metrics import CompilationState
from tandem_server.models.registry import CausalLM
from tandem_server.sampling import Sampler, SamplingBatch, SamplingRow
from tandem_server.sampling.statistics import TokenStatistics
from tandem_server.structured import grammar_token_mask


@dataclass(frozen=True)
class ExecutionOptions:
    """How steps run on the device: the KV cache's budget and dtype, and the CUDA-only features."""

    # CPU: bytes the KV cache takes (the draft model's beside the model's, when one runs); None: `auto`, sized at
    # Warmup from the cache's bytes per token and the memory available (kv_cache_default.py).
    kv_cache_memory: int | None = 1024**3
    # Ranks sharing this machine's memory, which `auto` budgets split.
    ranks_on_node: int = 1

    # CUDA: the KV cache takes this share of the memory left free after a profiled full-budget step.
    cuda_memory_fraction: float = 0.9
    # CUDA: batch sizes whose decode (and draft-verifying) steps are captured as graphs at Warmup; empty runs every
    # step eagerly.
    cuda_graph_sizes: tuple[int, ...] = ()
    # The KV cache's dtype, in which attention computes; None: the model's dtype.
    kv_cache_dtype: torch.dtype | None = None
    # Launch a step while the one before it is still open (its draws unread), so the host prepares step N+1 while
    # the device runs step N. Pays on an asynchronous device; on the CPU it only delays step N's answer.
    launch_ahead: bool = False
    # --torch-compile: WARMUP compiles the layers' stages and the decode graphs before Warmup returns (a step of
    # every row count that compiles a graph, so no request waits for a compile); BACKGROUND compiles the decode
    # graphs beside serving.
    compile_mode: CompileMode = CompileMode.OFF
    # BACKGROUND on one CPU rank: how a child process loads the model to build its decode package; None compiles on
    # a thread beside serving instead.
    decode_package: DecodePackageSpec | None = None
    # --max-loras and --max-lora-rank: the LoRA adapters the shard accepts and runs in one step.
    lora: LoraLimits = field(default_factory=LoraLimits)
    # --kv-offload-memory, --kv-offload-dir and --kv-offload-disk: the tiers that keep blocks the router evicts.
    kv_offload: KvOffloadOptions = field(default_factory=KvOffloadOptions)


# A forward step's timer marks: 0 step start, 1 forward start, 2 logits ready, 3 sampling done.
_FORWARD_START_MARK = 1
_FORWARD_END_MARK = 2


_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def _holds_gate(
    method: Callable[Concatenate[ModelRunner, _Params], _Result],
) -> Callable[Concatenate[ModelRunner, _Params], _Result]:
    """A runner method during which a background compile pauses."""

    @functools.wraps(method)
    def gated(runner: ModelRunner, *args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        with runner.execution.step():
            return method(runner, *args, **kwargs)

    return gated


@dataclass(frozen=True)
class DrawPositions:
    """Where a step draws: (request, the drafts ahead of the draw) per sampler row, the hidden row each reads, and
    each sampling request's first sampler row."""

    rows: list[tuple[RequestState, tuple[int, ...]]]
    hidden_rows: list[int]
    first_rows: list[tuple[RequestState, int]]


def _draw_positions(
    plan: list[tuple[RequestState, int]], last_rows: Sequence[int], drafts: dict[int, tuple[int, ...]]
) -> DrawPositions:
    """A request whose span reaches its end draws once, and once more per draft it ran (the draft's hidden row
    predicts the token after it)."""
    positions = DrawPositions([], [], [])
    for (state, num_tokens), last_row in zip(plan, last_rows, strict=True):
        if not state.samples_after(num_tokens):
            continue
        own_drafts = drafts.get(state.id, ())
        num_drafts = len(own_drafts)
        positions.first_rows.append((state, len(positions.rows)))
        for ahead in range(num_drafts + 1):
            positions.rows.append((state, own_drafts[:ahead]))
            positions.hidden_rows.append(last_row - num_drafts + ahead)
    return positions


class ModelRunner:
    """Owns the model, the KV cache and every request's state; one Step at a time."""

    def __init__(
        self,
        model: CausalLM,
        eos_token_ids: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
        options: ExecutionOptions = ExecutionOptions(),
        companions: Companions | None = None,
    ) -> None:
        companions = companions or Companions()
        self.model = model
        self.draft_model = companions.draft_model
        self.images = companions.images
        self.eos_token_ids = tuple(eos_token_ids)
        self.dtype = dtype
        self.cache_dtype = options.kv_cache_dtype or dtype
        self.device = device
        self.options = options
        self.requests = RequestTable(companions.grammar_compiler)
        self.cache: KVCache | None = None
        self.offload: KvOffload | None = None
        self.execution = Execution.build(model, device, options.compile_mode, options.decode_package)
        self.lora = LoraRegistry(model, options.lora, dtype, device)
        self.expert_tokens = ExpertTokenCounters(model)
        self.sampler = Sampler()
        # The timer of the latest step that ran a forward pass, until Warmup or Reset.
        self._last_forward: StepTimer | None = None
        # The latest launched step while its draws are unread; at most one step is open.
        self._open: LaunchedStep | None = None

    @_holds_gate
    @torch.inference_mode()
    def warmup(self, plan: WarmupPlan) -> WarmupResult:
        """Sizes and allocates the cache, runs one full-size step into the reserved block, captures graphs."""
        with self.expert_tokens.excluded():
            return self._warmup(plan)

    def _drop_cache(self) -> None:
        """Forgets every request and the cache they used, before a Warmup allocates another."""
        # A background compile compiles into the cache about to be replaced.
        self.execution.stop()
        self.requests.clear()
        self._last_forward = None
        # A step still open belongs to requests that no longer exist; completing it would deliver nothing.
        self._open = None
        self.cache = None
        if self.offload is not None:
            self.offload.close()
        self.offload = None

    def _warmup(self, plan: WarmupPlan) -> WarmupResult:
        block_size, max_batch_tokens, max_batch_requests = (
            plan.block_size,
            plan.max_batch_tokens,
            plan.max_batch_requests,
        )
        if block_size < 1 or max_batch_tokens < 1 or max_batch_requests < 1:
            raise InvalidStepError("block_size, max_batch_tokens and max_batch_requests must be positive")
        spec = self.model.spec
        if spec.state_shapes and plan.max_drafts > 0:
            raise InvalidStepError(
                "speculative decoding is not supported for a model with recurrent state (a rejected draft cannot be "
                "taken back out of the state); start without --speculate"
            )
        geometry = CacheGeometry.of(spec, block_size, self.cache_dtype)
        options = self.options
        drafting_requests = min(plan.max_drafting_requests, max_batch_requests)
        shapes = model_graph_shapes(spec, options.cuda_graph_sizes, plan.max_drafts, drafting_requests)
        limits = WarmupLimits(max_batch_tokens, max_batch_requests, options.cuda_memory_fraction, shapes)
        self._drop_cache()
        drafting = self.draft_model
        # A block holds the draft model's keys and values beside the model's: the router's block ids address both.
        draft_geometry = drafting.geometry(block_size) if drafting is not None else None
        bytes_per_block = geometry.bytes_per_block + (draft_geometry.bytes_per_block if draft_geometry else 0)
        draft_shapes = drafting_shapes(shapes) if drafting is not None else ()
        if self.device.type == "cuda":
            # The recurrent state pool and the LoRA slots are allocated beside the cache, out of the same budget.
            budget = profile_cuda_budget(self.model, geometry, limits) - state_pool_bytes(
                spec.state_shapes, max_batch_requests, self.dtype, spec.state_dtypes
            )
            budget -= self.lora.device_bytes
            budget -= self.images.cache.max_bytes if self.images is not None else 0
            if drafting is not None and draft_geometry is not None:
                budget -= profile_graph_bytes(drafting.model, draft_geometry, draft_shapes, self.device)
            budget_flag = "--cuda-memory-fraction"
        else:
            budget = cpu_cache_budget(options.kv_cache_memory, geometry, draft_geometry, options.ranks_on_node)
            budget_flag = "--kv-cache-memory"
        bytes_per_checkpoint = state_pool_bytes(spec.state_shapes, 1, self.dtype, spec.state_dtypes)
        num_checkpoints = state_checkpoints_for_budget(plan.max_state_checkpoints, bytes_per_checkpoint, budget)
        num_blocks = blocks_for_budget(bytes_per_block, budget - num_checkpoints * bytes_per_checkpoint, budget_flag)
        cache = KVCache(geometry, num_blocks, self.device)
        run_reserved_forward(self.model, cache, limits)
        if drafting is not None and draft_geometry is not None:
            draft_cache = KVCache(draft_geometry, num_blocks, self.device)
            run_reserved_forward(drafting.model, draft_cache, limits)
            drafting.bind(draft_cache, ExecutionPlan(max_batch_tokens, max_batch_requests, draft_shapes))
        self.execution.prepare(
            cache, ExecutionPlan(max_batch_tokens, max_batch_requests, shapes), self.dtype, num_checkpoints
        )
        self.cache = cache
        bound_draft_cache = drafting.cache if drafting is not None else None
        draft_bytes = bound_draft_cache.nbytes if bound_draft_cache is not None else 0
        # Prefixes of a model with recurrent state resume from state checkpoints, which the tiers do not hold.
        if options.kv_offload.host_bytes > 0 and not spec.state_shapes:
            caches = [cache] if bound_draft_cache is None else [cache, bound_draft_cache]
            self.offload = KvOffload(caches, options.kv_offload)
        offload = self.offload
        # The full-size step's activations are freed by now; their pages go back rather than stay for reuse.
        return_freed_memory()
        return WarmupResult(
            num_blocks=num_blocks,
            kv_cache_bytes=cache.nbytes + draft_bytes,
            num_state_checkpoints=num_checkpoints,
            state_checkpoint_bytes=num_checkpoints * bytes_per_checkpoint,
            num_host_offload_slots=offload.host_slots if offload is not None else 0,
            num_disk_offload_slots=offload.disk_slots if offload is not None else 0,
            offload_block_bytes=offload.block_bytes if offload is not None else 0,
        )

    def compilation(self) -> CompilationState:
        """What `--torch-compile` has compiled so far; safe to read from any thread."""
        return self.execution.compilation()

    @_holds_gate
    @torch.inference_mode()
    def health_check(self) -> None:
        """A one-token forward into the reserved block: proves the model and the cache still work."""
        with self.expert_tokens.excluded():
            run_reserved_forward(self.model, self._require_cache(), WarmupLimits(1, 1))

    def reset(self) -> None:
        """Forgets every request; the cache's contents become garbage the router no longer references."""
        self.requests.clear()
        self._last_forward = None
        # A step still open belongs to requests that no longer exist; completing it would deliver nothing.
        self._open = None
        self.execution.clear()
        if self.draft_model is not None:
            self.draft_model.clear()

    def step(self, step: StepInput) -> StepOutput:
        """Runs one Step to completion: `launch` then `complete`."""
        return self.complete(self.launch(step))

    @_holds_gate
    @torch.inference_mode()
    def launch(self, step: StepInput) -> LaunchedStep:
        """Applies the Step and queues its forward pass and sampling on the device without reading the results.

        With `launch_ahead`, the step before it may still be open: a request it sampled runs here on its reserved
        token, whose id is copied on the device (and counted there by its penalties). A request whose grammar
        needs that token on the host completes the open step first, and so does every step without `launch_ahead`.
        """
        cache = self._require_cache()
        open_step = self._open
        if open_step is not None and (not self.options.launch_ahead or self._reads_pending_tokens(step)):
            self.complete(open_step)
        timer = StepTimer(self.device)
        failed_transfers = self._run_kv_transfers(step.kv_transfers)
        spec = self.model.spec
        drafting = self.draft_model is not None
        limits = StepLimits(
            cache.block_size,
            cache.num_blocks,
            spec.max_position_embeddings,
            spec.vocab_size,
            drafting,
            self.lora.names(),
            self.options.lora.max_loras,
            self.images.image_token_id if self.images is not None else None,
            self.images.token_grid if self.images is not None and self.images.grid_positions else None,
        )
        applied, pieces = self._runnable(self.requests.apply(step, limits))
        plan = applied.plan
        # The router never lists the requests the shard ended itself: what the execution keeps for them goes too.
        forgotten = [*step.finished, *(request.id for request in step.new_requests), *self.requests.ended_before]
        self.execution.forget(forgotten)
        if self.draft_model is not None:
            self.draft_model.forget(forgotten)
        if not plan:
            timer.mark()
            return LaunchedStep(timer, None, (*applied.failures,), (), failed_kv_transfers=failed_transfers)
        drafts = {**applied.drafts, **self._model_drafts(plan, applied.model_drafts)}
        both_ways = bidirectional_spans(pieces) if self.images is not None and self.images.bidirectional_spans else {}
        spans = [
            ScheduledSpan(
                [*state.token_ids[state.num_computed : state.num_computed + num_tokens], *drafts.get(state.id, ())],
                state.num_computed,
                state.block_table,
                state.id,
                both_ways.get(state.id, ()),
            )
            for state, num_tokens in plan
        ]
        adapters = [state.lora_adapter for state, _ in plan]
        lora = self.lora.step(adapters, [len(span.token_ids) for span in spans], self.device)
        batch = build_step_batch(spans, cache.block_size, self.device, lora)
        if pieces:
            batch = replace(batch, embeddings=input_embeddings(pieces, spans, self.device))
        grids = {state.id: state.image_grids for state, _ in plan if state.image_grids is not None}
        if grids:
            batch = replace(batch, positions=rotary_positions(spans, grids, self.device))
        self._copy_pending_tokens(plan, batch, open_step)
        # Every host-to-device copy happens here, before the forward pass; the results stay on the device until
        # `complete` reads them in one transfer (prompt logprobs, when asked for, add their own).
        draws = _draw_positions(plan, batch.last_rows, drafts)
        sampling = self._sampling_batch(draws.rows, open_step) if draws.rows else None
        sample_rows = to_device(torch.tensor(draws.hidden_rows, dtype=torch.long), self.device)
        timer.mark()
        self.execution.restore_states(applied.state_restores, {state.id: state.num_computed for state, _ in plan})
        hidden = self.execution.forward(batch, cache.layers)
        self.execution.save_states(applied.state_saves)
        prompt_logprobs = self._prompt_logprobs(plan, batch.last_rows, hidden)
        for state, num_tokens in plan:
            state.num_computed += num_tokens
        logits = self.model.compute_logits(hidden[sample_rows]) if sampling is not None else None
        timer.mark()
        sampled = self.sampler.sample(logits, sampling.batch) if logits is not None and sampling is not None else None
        rows = tuple(
            DraftedRow(state, drafts[state.id], first)
            if state.id in drafts
            else PendingRow(state, state.reserve_token(), first)
            for state, first in draws.first_rows
        )
        timer.mark()
        previous, self._last_forward = self._last_forward, timer
        launched = LaunchedStep(
            timer, previous, (*applied.failures,), prompt_logprobs, rows, sampling, sampled, failed_transfers
        )
        self._open = launched
        return launched

    @_holds_gate
    @torch.inference_mode()
    def complete(self, launched: LaunchedStep) -> StepOutput:
        """Reads a launched step's draws and applies them; repeated calls return (or raise) the same outcome."""
        if launched.outcome is None:
            try:
                launched.outcome = self._read_results(launched)
            except BaseException as error:
                launched.outcome = error
            finally:
                if self._open is launched:
                    self._open = None
        if isinstance(launched.outcome, BaseException):
            raise launched.outcome
        return launched.outcome

    def _read_results(self, launched: LaunchedStep) -> StepOutput:
        sampled = None
        if launched.sampled is not None and launched.sampling is not None:
            sampling = launched.sampling
            sampled = apply_draws(self.requests, launched.rows, launched.sampled.to_host(), sampling.grammar_failures)
        timer, previous = launched.timer, launched.previous
        phases = timer.phases_ms()
        if len(phases) == 1:
            return StepOutput(
                (),
                forward_ms=0.0,
                sampling_ms=0.0,
                prepare_ms=phases[0],
                failures=launched.failures,
                failed_kv_transfers=launched.failed_kv_transfers,
            )
        prepare_ms, forward_ms, sampling_ms = phases
        gap_ms = timer.ms_since(previous, _FORWARD_END_MARK, _FORWARD_START_MARK) if previous is not None else 0.0
        return StepOutput(
            forward_gap_ms=gap_ms,
            generations=tuple(sampled.generations) if sampled else (),
            forward_ms=forward_ms,
            sampling_ms=sampling_ms,
            prepare_ms=prepare_ms,
            prompt_logprobs=launched.prompt_logprobs,
            failures=(*launched.failures, *(sampled.failures if sampled else ())),
            failed_kv_transfers=launched.failed_kv_transfers,
        )

    def _run_kv_transfers(self, transfers: Sequence[KvTransfer]) -> tuple[int, ...]:
        """Runs the Step's copies between the cache and the offload tiers; the positions of failed disk reads."""
        if not transfers:
            return ()
        if self.offload is None:
            raise InvalidStepError("the Step carries KV transfers but this shard keeps no offload tiers")
        return self.offload.run(transfers)

    def _runnable(self, applied: AppliedStep) -> tuple[AppliedStep, list[ImagePiece]]:
        """`applied` without the requests that cannot run (their LoRA adapter is unreadable, an image cannot be
        encoded), each failing alone, and the image pieces the rest run on. A step with no image spans encodes
        nothing."""
        unreadable = self.lora.make_resident(state.lora_adapter for state, _ in applied.plan)
        applied = self.requests.fail_under_adapters(applied, unreadable) if unreadable else applied
        if self.images is None or not any(state.images for state, _ in applied.plan):
            return applied, []
        pieces, failures = scheduled_pieces(applied.plan, self.images)
        return (self.requests.fail_planned(applied, failures) if failures else applied), pieces

    def _model_drafts(self, plan: list[tuple[RequestState, int]], counts: dict[int, int]) -> dict[int, tuple[int, ...]]:
        """The draft model's drafts for the planned requests that ask for some (checked: only with a draft model)."""
        rows = [DraftRow(state, counts[state.id]) for state, _ in plan if state.id in counts]
        if not rows or self.draft_model is None:
            return {}
        return self.draft_model.propose(rows)

    def _reads_pending_tokens(self, step: StepInput) -> bool:
        """True when a request the step schedules has a pending token its sampling inputs read on the host."""
        scheduled = {request.id for request in step.scheduled}
        open_step = self._open
        return open_step is not None and any(
            row.state.id in scheduled and row.state.needs_host_tokens() for row in open_step.rows
        )

    def _copy_pending_tokens(
        self, plan: list[tuple[RequestState, int]], batch: StepBatch, open_step: LaunchedStep | None
    ) -> None:
        """Fills the input ids of reserved tokens from the open step's draws, on the device."""
        targets, sources = [], []
        for (state, num_tokens), last_row in zip(plan, batch.last_rows, strict=True):
            if not (state.samples_after(num_tokens) and state.has_pending_token):
                continue
            source = open_step.sampled_row(state) if open_step is not None else None
            if source is None:
                raise InvalidStepError(f"request {state.id} runs a token that was never sampled")
            targets.append(last_row)
            sources.append(source)
        if targets and open_step is not None:
            index = to_device(torch.tensor(sources, dtype=torch.long), self.device)
            batch.input_ids[to_device(torch.tensor(targets, dtype=torch.long), self.device)] = open_step.sampled_ids()[
                index
            ]

    def _prompt_logprobs(
        self, plan: list[tuple[RequestState, int]], last_rows: Sequence[int], hidden: torch.Tensor
    ) -> tuple[PromptLogprobs, ...]:
        # Runs before num_computed advances: each state's num_computed is still its chunk's first position.
        chunks = (
            ScoredChunk(state, last_row - num_tokens + 1, state.num_computed, num_tokens)
            for (state, num_tokens), last_row in zip(plan, last_rows, strict=True)
            if state.prompt_logprobs
        )
        scored = (chunk_prompt_logprobs(self.model, hidden, chunk) for chunk in chunks)
        return tuple(result for result in scored if result is not None)

    def _sampling_batch(
        self, rows: list[tuple[RequestState, tuple[int, ...]]], open_step: LaunchedStep | None
    ) -> StepSampling:
        # A token's draw is seeded by the position it will occupy, so recompute after preemption repeats it, and a
        # draw behind drafts is the one the request makes once they are its tokens: its position, bans, penalty
        # counts and grammar mask all count them.
        sampling_rows = [
            SamplingRow(
                params=s.sampling,
                position=len(s.token_ids) + len(drafted),
                statistics=self._statistics(s, open_step),
                banned_ids=s.banned_token_ids(len(drafted)),
                top_logprobs=s.top_logprobs,
                drafted=drafted,
            )
            for s, drafted in rows
        ]
        # Every rank holds the same matchers over the same tokens, so every rank applies the same mask.
        vocab_size = self.model.spec.vocab_size
        drafted_rows = [drafted for _, drafted in rows]
        mask = grammar_token_mask([s.grammar for s, _ in rows], vocab_size, self.device, drafted_rows)
        return StepSampling(SamplingBatch.build(sampling_rows, self.device, mask.allowed), mask.failures)

    def _statistics(self, state: RequestState, open_step: LaunchedStep | None) -> TokenStatistics | None:
        # Built once, from everything the request holds when it first samples; `append_generated` keeps it current.
        # A token the open step sampled is counted on the device, so its draw need not reach the host first.
        pending = open_step.pending_token(state) if open_step is not None and state.has_pending_token else None
        if state.statistics is None and TokenStatistics.needed(state.sampling):
            known = state.token_ids[:-1] if pending is not None else state.token_ids
            vocab_size = self.model.spec.vocab_size
            state.statistics = TokenStatistics(state.sampling, known, state.prompt_len, vocab_size, self.device)
        if state.statistics is not None and pending is not None:
            state.statistics.record_on_device(pending)
        return state.statistics

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise NotWarmedUpError("the shard has not been warmed up; call Warmup first")
        return self.cache
