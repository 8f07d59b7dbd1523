"""ModelRunner: applies a Step to the request state, runs the model once, samples and stops requests."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.kv_cache import CacheGeometry, KVCache
from tandem_server.engine.prompt_logprobs import ScoredChunk, chunk_prompt_logprobs
from tandem_server.engine.requests import RequestState, RequestTable, StepLimits
from tandem_server.engine.step import Generation, PromptLogprobs, StepInput, StepOutput, WarmupResult
from tandem_server.engine.warmup import blocks_for_budget, run_reserved_forward
from tandem_server.errors import InvalidStepError, NotWarmedUpError
from tandem_server.models.registry import CausalLM
from tandem_server.sampling import Sampler, SamplingBatch, SamplingRow
from tandem_server.structured import GrammarCompiler, grammar_token_mask


class ModelRunner:
    """Owns the model, the KV cache and every request's state; one Step at a time."""

    def __init__(
        self,
        model: CausalLM,
        eos_token_ids: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
        kv_cache_memory: int,
        grammar_compiler: GrammarCompiler | None = None,
    ) -> None:
        self.model = model
        self.eos_token_ids = tuple(eos_token_ids)
        self.dtype = dtype
        self.device = device
        self.kv_cache_memory = kv_cache_memory
        self.requests = RequestTable(grammar_compiler)
        self.cache: KVCache | None = None
        self.sampler = Sampler()

    @torch.inference_mode()
    def warmup(self, block_size: int, max_batch_tokens: int, max_batch_requests: int) -> WarmupResult:
        """Allocates the cache for the memory budget and runs one full-size step into the reserved block."""
        if block_size < 1 or max_batch_tokens < 1 or max_batch_requests < 1:
            raise InvalidStepError("block_size, max_batch_tokens and max_batch_requests must be positive")
        spec = self.model.spec
        geometry = CacheGeometry(spec.num_layers, block_size, spec.num_kv_heads, spec.head_dim, self.dtype)
        num_blocks = blocks_for_budget(geometry, self.kv_cache_memory)
        self.requests.clear()
        self.cache = None
        cache = KVCache(geometry, num_blocks, self.device)
        run_reserved_forward(self.model, cache, max_batch_tokens, max_batch_requests)
        self.cache = cache
        return WarmupResult(num_blocks=num_blocks, kv_cache_bytes=cache.nbytes)

    @torch.inference_mode()
    def health_check(self) -> None:
        """A one-token forward into the reserved block: proves the model and the cache still work."""
        run_reserved_forward(self.model, self._require_cache(), 1, 1)

    def reset(self) -> None:
        """Forgets every request; the cache's contents become garbage the router no longer references."""
        self.requests.clear()

    @torch.inference_mode()
    def step(self, step: StepInput) -> StepOutput:
        """Runs the scheduled tokens and returns a Generation for each request that reached its end."""
        cache = self._require_cache()
        start = time.perf_counter()
        limits = StepLimits(cache.block_size, cache.num_blocks, self.model.spec.max_position_embeddings)
        plan = self.requests.apply(step, limits)
        if not plan:
            return StepOutput(generations=(), forward_ms=0.0, sampling_ms=0.0, prepare_ms=self._elapsed_ms(start))
        spans = [
            ScheduledSpan(
                state.token_ids[state.num_computed : state.num_computed + num_tokens],
                state.num_computed,
                state.block_table,
            )
            for state, num_tokens in plan
        ]
        batch = build_step_batch(spans, cache.block_size, self.device)
        prepare_ms = self._elapsed_ms(start)
        start = time.perf_counter()
        hidden = self.model(batch.input_ids, batch.positions, cache.layers, batch.metadata)
        prompt_logprobs = self._prompt_logprobs(plan, batch.last_rows, hidden)
        for state, num_tokens in plan:
            state.num_computed += num_tokens
        finishing = [
            (state, row) for (state, _), row in zip(plan, batch.last_rows, strict=True) if state.ready_to_sample
        ]
        logits = self.model.compute_logits(hidden[[row for _, row in finishing]]) if finishing else None
        forward_ms = self._elapsed_ms(start)
        start = time.perf_counter()
        generations = self._sample([state for state, _ in finishing], logits) if logits is not None else ()
        return StepOutput(
            generations=generations,
            forward_ms=forward_ms,
            sampling_ms=self._elapsed_ms(start),
            prepare_ms=prepare_ms,
            prompt_logprobs=prompt_logprobs,
        )

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

    def _sample(self, states: list[RequestState], logits: torch.Tensor) -> tuple[Generation, ...]:
        # A token's draw is seeded by the position it will occupy, so recompute after preemption repeats it.
        rows = [
            SamplingRow(
                params=s.sampling,
                position=len(s.token_ids),
                token_ids=s.token_ids,
                prompt_len=s.prompt_len,
                banned_ids=s.banned_token_ids(self.eos_token_ids),
                top_logprobs=s.top_logprobs,
            )
            for s in states
        ]
        # Every rank holds the same matchers over the same tokens, so every rank applies the same mask.
        token_mask = grammar_token_mask([s.grammar for s in states], logits.shape[-1], logits.device)
        sampled = self.sampler(logits, SamplingBatch.build(rows, self.device, token_mask))
        generations = []
        for state, token_id, logprob, top in zip(
            states, sampled.token_ids, sampled.logprobs, sampled.top_logprobs, strict=True
        ):
            reason = state.append_generated(token_id, self.eos_token_ids)
            if reason is not None:
                self.requests.forget([state.id])
            generations.append(Generation(state.id, token_id, logprob, reason, top))
        return tuple(generations)

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise NotWarmedUpError("the shard has not been warmed up; call Warmup first")
        return self.cache

    def _elapsed_ms(self, start: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) * 1000.0
