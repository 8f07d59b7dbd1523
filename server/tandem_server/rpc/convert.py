"""Protobuf <-> engine dataclasses; the only module that knows both shapes."""

from __future__ import annotations

from tandem_server.engine.step import (
    FinishReason,
    ImageInput,
    NewRequest,
    PromptLogprobs,
    RequestFailure,
    ScheduledRequest,
    StepInput,
    StepOutput,
    StoppingCriteria,
    WarmupPlan,
    WarmupResult,
)
from tandem_server.errors import FailureKind, InvalidStepError
from tandem_server.execution.kv_offload import KvTransfer, Medium
from tandem_server.lora import AdapterSummary
from tandem_server.metrics import CompilationState
from tandem_server.rpc.generated import shard_pb2
from tandem_server.sampling import SamplingParams
from tandem_server.sampling.logprobs import TokenLogprobs
from tandem_server.structured import GrammarKind, GrammarSpec

_FINISH_REASONS = {
    None: shard_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.LENGTH: shard_pb2.FINISH_REASON_LENGTH,
    FinishReason.EOS: shard_pb2.FINISH_REASON_EOS,
    FinishReason.STOP_TOKEN: shard_pb2.FINISH_REASON_STOP_TOKEN,
}

_FAILURE_KINDS = {
    FailureKind.TOKEN_OUT_OF_RANGE: shard_pb2.FAILURE_KIND_TOKEN_OUT_OF_RANGE,
    FailureKind.INVALID_PARAMETERS: shard_pb2.FAILURE_KIND_INVALID_PARAMETERS,
    FailureKind.GRAMMAR: shard_pb2.FAILURE_KIND_GRAMMAR,
    FailureKind.NO_VALID_TOKEN: shard_pb2.FAILURE_KIND_NO_VALID_TOKEN,
    FailureKind.NON_FINITE_LOGITS: shard_pb2.FAILURE_KIND_NON_FINITE_LOGITS,
    FailureKind.ADAPTER_UNAVAILABLE: shard_pb2.FAILURE_KIND_ADAPTER_UNAVAILABLE,
}


_MEDIA: dict[int, Medium] = {
    shard_pb2.KV_MEDIUM_DEVICE: Medium.DEVICE,
    shard_pb2.KV_MEDIUM_HOST: Medium.HOST,
    shard_pb2.KV_MEDIUM_DISK: Medium.DISK,
}


def _medium(medium: int) -> Medium:
    if medium not in _MEDIA:
        raise InvalidStepError(f"a KV transfer names an unknown medium ({medium})")
    return _MEDIA[medium]


def step_input_from_pb(request: shard_pb2.StepRequest) -> StepInput:
    """The engine's view of a StepRequest."""
    return StepInput(
        new_requests=tuple(_new_request_from_pb(r) for r in request.new_requests),
        scheduled=tuple(
            ScheduledRequest(
                id=s.id,
                num_tokens=s.num_tokens,
                new_block_ids=tuple(s.new_block_ids),
                num_computed_tokens=s.num_computed_tokens,
                draft_token_ids=tuple(s.draft_token_ids),
                num_model_drafts=s.num_model_drafts,
                restore_state_checkpoint=s.restore_state_checkpoint if s.HasField("restore_state_checkpoint") else None,
                save_state_checkpoint=s.save_state_checkpoint if s.HasField("save_state_checkpoint") else None,
            )
            for s in request.scheduled
        ),
        finished=tuple(request.finished),
        kv_transfers=tuple(
            KvTransfer(_medium(t.source), t.source_index, _medium(t.target), t.target_index)
            for t in request.kv_transfers
        ),
    )


def _one_if_zero(value: float) -> float:
    # The contract's zero means "disabled" where the engine's neutral value is 1.0.
    return value if value > 0 else 1.0


def _sampling_from_pb(sampling: shard_pb2.SamplingParameters) -> SamplingParams:
    return SamplingParams(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=_one_if_zero(sampling.top_p),
        seed=sampling.seed,
        min_p=sampling.min_p,
        typical_p=_one_if_zero(sampling.typical_p),
        repetition_penalty=_one_if_zero(sampling.repetition_penalty),
        frequency_penalty=sampling.frequency_penalty,
        presence_penalty=sampling.presence_penalty,
        logit_bias=tuple(sorted(sampling.logit_bias.items())),
    )


def _new_request_from_pb(request: shard_pb2.NewRequest) -> NewRequest:
    return NewRequest(
        id=request.id,
        token_ids=tuple(request.token_ids),
        num_output_tokens=request.num_output_tokens,
        sampling=_sampling_from_pb(request.sampling),
        stopping=StoppingCriteria(
            max_new_tokens=request.stopping.max_new_tokens,
            stop_token_ids=tuple(request.stopping.stop_token_ids),
            min_new_tokens=request.stopping.min_new_tokens,
        ),
        top_logprobs=request.top_logprobs,
        prompt_logprobs=request.prompt_logprobs,
        grammar=_grammar_from_pb(request),
        lora_adapter=request.lora_adapter,
        images=tuple(
            ImageInput(data=image.data, digest=image.digest, offset=image.offset, num_tokens=image.num_tokens)
            for image in request.images
        ),
    )


def _grammar_from_pb(request: shard_pb2.NewRequest) -> GrammarSpec | None:
    if not request.HasField("grammar"):
        return None
    kind = request.grammar.WhichOneof("kind")
    if kind is None:
        return None
    return GrammarSpec(GrammarKind(kind), getattr(request.grammar, kind))


def _token_logprobs_to_pb(tokens: TokenLogprobs) -> list[shard_pb2.TokenLogprob]:
    return [shard_pb2.TokenLogprob(token_id=token_id, logprob=logprob) for token_id, logprob in tokens]


def _prompt_logprobs_to_pb(chunk: PromptLogprobs) -> shard_pb2.PromptLogprobs:
    return shard_pb2.PromptLogprobs(
        id=chunk.id,
        first_position=chunk.first_position,
        logprobs=chunk.logprobs,
        top=[shard_pb2.TopLogprobs(tokens=_token_logprobs_to_pb(top)) for top in chunk.top],
    )


def step_output_to_pb(output: StepOutput) -> shard_pb2.StepResponse:
    """The StepResponse for the engine's StepOutput."""
    return shard_pb2.StepResponse(
        generations=[
            shard_pb2.Generation(
                id=g.id,
                token_id=g.token_id,
                logprob=g.logprob,
                finish_reason=_FINISH_REASONS[g.finish_reason],
                top_logprobs=_token_logprobs_to_pb(g.top_logprobs),
            )
            for g in output.generations
        ],
        forward_ms=output.forward_ms,
        sampling_ms=output.sampling_ms,
        prepare_ms=output.prepare_ms,
        prompt_logprobs=[_prompt_logprobs_to_pb(chunk) for chunk in output.prompt_logprobs],
        failures=[_failure_to_pb(failure) for failure in output.failures],
        forward_gap_ms=output.forward_gap_ms,
        failed_kv_transfers=output.failed_kv_transfers,
    )


def _failure_to_pb(failure: RequestFailure) -> shard_pb2.RequestFailure:
    return shard_pb2.RequestFailure(id=failure.id, kind=_FAILURE_KINDS[failure.kind], message=failure.message)


def warmup_plan_from_pb(request: shard_pb2.WarmupRequest) -> WarmupPlan:
    """The engine's WarmupPlan for a WarmupRequest."""
    return WarmupPlan(
        block_size=request.block_size,
        max_batch_tokens=request.max_batch_tokens,
        max_batch_requests=request.max_batch_requests,
        max_drafts=request.max_drafts,
        max_drafting_requests=request.max_drafting_requests,
        max_state_checkpoints=request.max_state_checkpoints,
    )


def compilation_to_pb(state: CompilationState) -> shard_pb2.Compilation:
    """What has compiled: decode steps of up to the largest compiled row count run a graph (Warmup compiles row
    counts in increasing order, each crossing the weight formats' row thresholds)."""
    return shard_pb2.Compilation(decode_rows=max(state.compiled_decode_rows, default=0), compiling=state.compiling)


def warmup_result_to_pb(result: WarmupResult) -> shard_pb2.WarmupResponse:
    """The WarmupResponse for the engine's WarmupResult."""
    return shard_pb2.WarmupResponse(
        num_blocks=result.num_blocks,
        kv_cache_bytes=result.kv_cache_bytes,
        num_state_checkpoints=result.num_state_checkpoints,
        state_checkpoint_bytes=result.state_checkpoint_bytes,
        num_host_offload_slots=result.num_host_offload_slots,
        num_disk_offload_slots=result.num_disk_offload_slots,
        offload_block_bytes=result.offload_block_bytes,
    )


def lora_adapter_to_pb(adapter: AdapterSummary) -> shard_pb2.LoraAdapter:
    return shard_pb2.LoraAdapter(name=adapter.name, rank=adapter.rank, target_modules=sorted(adapter.target_modules))
