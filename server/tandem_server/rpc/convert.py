"""Protobuf <-> engine dataclasses; the only module that knows both shapes."""

from __future__ import annotations

from tandem_server.engine.step import (
    FinishReason,
    NewRequest,
    ScheduledRequest,
    StepInput,
    StepOutput,
    StoppingCriteria,
    WarmupResult,
)
from tandem_server.rpc.generated import shard_pb2
from tandem_server.sampling import SamplingParams

_FINISH_REASONS = {
    None: shard_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.LENGTH: shard_pb2.FINISH_REASON_LENGTH,
    FinishReason.EOS: shard_pb2.FINISH_REASON_EOS,
    FinishReason.STOP_TOKEN: shard_pb2.FINISH_REASON_STOP_TOKEN,
}


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
            )
            for s in request.scheduled
        ),
        finished=tuple(request.finished),
    )


def _new_request_from_pb(request: shard_pb2.NewRequest) -> NewRequest:
    sampling = request.sampling
    # An unset SamplingParameters message reads as all zeros; top_p 0 there means "disabled", not "keep one".
    top_p = sampling.top_p if request.HasField("sampling") and sampling.top_p > 0 else 1.0
    return NewRequest(
        id=request.id,
        token_ids=tuple(request.token_ids),
        num_output_tokens=request.num_output_tokens,
        sampling=SamplingParams(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=top_p, seed=sampling.seed
        ),
        stopping=StoppingCriteria(
            max_new_tokens=request.stopping.max_new_tokens,
            ignore_eos=request.stopping.ignore_eos,
            stop_token_ids=tuple(request.stopping.stop_token_ids),
        ),
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
            )
            for g in output.generations
        ],
        forward_ms=output.forward_ms,
        sampling_ms=output.sampling_ms,
    )


def warmup_result_to_pb(result: WarmupResult) -> shard_pb2.WarmupResponse:
    """The WarmupResponse for the engine's WarmupResult."""
    return shard_pb2.WarmupResponse(num_blocks=result.num_blocks, kv_cache_bytes=result.kv_cache_bytes)
