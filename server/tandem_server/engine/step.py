"""Engine-side form of the Step contract; `rpc/convert.py` maps protobuf to and from these."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tandem_server.errors import FailureKind
from tandem_server.execution.kv_offload import KvTransfer
from tandem_server.sampling import SamplingParams
from tandem_server.sampling.logprobs import TokenLogprobs
from tandem_server.structured import GrammarSpec


class FinishReason(Enum):
    """Why the shard stopped a request."""

    LENGTH = "length"
    EOS = "eos"
    STOP_TOKEN = "stop_token"


@dataclass(frozen=True)
class RequestFailure:
    """A request the shard ended and forgot; `message` is short and safe to show its client."""

    id: int
    kind: FailureKind
    message: str


@dataclass(frozen=True)
class StoppingCriteria:
    """Token-level stop conditions; `max_new_tokens` counts tokens generated before a preemption too."""

    max_new_tokens: int
    # Every token that ends the request, the model's EOS ids included unless the client ignores them.
    stop_token_ids: tuple[int, ...] = ()
    # Stop tokens are masked until this many tokens were generated.
    min_new_tokens: int = 0


@dataclass(frozen=True)
class ImageInput:
    """An image in a prompt: its encoded file, the file's SHA-256, and the prompt positions [offset, offset +
    num_tokens) that hold the image token and run on the image's embeddings instead."""

    data: bytes
    digest: bytes
    offset: int
    num_tokens: int

    @property
    def end(self) -> int:
        """The first position after the span."""
        return self.offset + self.num_tokens


@dataclass(frozen=True)
class NewRequest:
    """A request the shard has not seen: prompt plus any tokens generated before a preemption."""

    id: int
    token_ids: tuple[int, ...]
    num_output_tokens: int
    sampling: SamplingParams
    stopping: StoppingCriteria
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    # None means unconstrained.
    grammar: GrammarSpec | None = None
    # The LoRA adapter the request runs under, by name; empty: the base model.
    lora_adapter: str = ""
    # The prompt's images in prompt order, with disjoint spans.
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True)
class ScheduledRequest:
    """`num_tokens` to run now, starting at `num_computed_tokens`, after appending `new_block_ids`.

    `draft_token_ids` are proposed continuations run after the request's last token in the same forward pass: the
    shard keeps each draft the request would have sampled itself and returns the accepted ones and one more token.
    `num_model_drafts` asks the shard's draft model for that many drafts instead, run and kept the same way.
    A model with recurrent state restores a new request's state from `restore_state_checkpoint` before the step and
    saves the request's state into `save_state_checkpoint` after it.
    """

    id: int
    num_tokens: int
    new_block_ids: tuple[int, ...]
    num_computed_tokens: int
    draft_token_ids: tuple[int, ...] = ()
    num_model_drafts: int = 0
    restore_state_checkpoint: int | None = None
    save_state_checkpoint: int | None = None

    @property
    def num_drafts(self) -> int:
        return len(self.draft_token_ids) or self.num_model_drafts


@dataclass(frozen=True)
class StepInput:
    """One forward pass as the router scheduled it."""

    new_requests: tuple[NewRequest, ...] = ()
    scheduled: tuple[ScheduledRequest, ...] = ()
    finished: tuple[int, ...] = ()
    # Copies between the KV cache and the offload tiers, run in order before anything else.
    kv_transfers: tuple[KvTransfer, ...] = ()

    @property
    def phase(self) -> str | None:
        """`decode` when every request runs one token it generated, `prefill` when none does, else `mixed`; None when
        nothing is scheduled (no forward pass)."""
        if not self.scheduled:
            return None
        new_ids = {request.id for request in self.new_requests}
        decoding = [scheduled.num_tokens == 1 and scheduled.id not in new_ids for scheduled in self.scheduled]
        if all(decoding):
            return "decode"
        if not any(decoding):
            return "prefill"
        return "mixed"


@dataclass(frozen=True)
class Generation:
    """The token a request produced this step; `finish_reason` is set when the shard stopped it."""

    id: int
    token_id: int
    logprob: float
    finish_reason: FinishReason | None
    top_logprobs: TokenLogprobs = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """logprobs[i] = log P(prompt[first_position + i] | prompt before it), computed by one chunk."""

    id: int
    first_position: int
    logprobs: tuple[float, ...]
    # Parallel to `logprobs` when the request asked for alternatives, else empty.
    top: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """Generations in scheduled order plus timings for metrics."""

    generations: tuple[Generation, ...]
    # Model only: embeddings through logits, plus prompt logprobs when asked.
    forward_ms: float
    sampling_ms: float
    # Request-state updates and the step's input tensors, before the model runs.
    prepare_ms: float = 0.0
    prompt_logprobs: tuple[PromptLogprobs, ...] = ()
    # Requests that failed on their own; none of them is in `generations`.
    failures: tuple[RequestFailure, ...] = ()
    # The model's idle time from the previous step's forward end to this one's start; 0 when none ran before.
    forward_gap_ms: float = 0.0
    # Positions in the Step's `kv_transfers` of disk reads that found no intact entry.
    failed_kv_transfers: tuple[int, ...] = ()


@dataclass(frozen=True)
class WarmupPlan:
    """The largest step the router will schedule, and the drafts its steps may carry."""

    block_size: int
    max_batch_tokens: int
    max_batch_requests: int
    # Drafts one request may carry in a step; steps carry drafts only while at most `max_drafting_requests` run.
    max_drafts: int = 0
    max_drafting_requests: int = 0
    # A model with recurrent state: the most state checkpoints the router may address.
    max_state_checkpoints: int = 0


@dataclass(frozen=True)
class WarmupResult:
    """Blocks the router may use (ids 0..num_blocks-1) and the bytes the whole cache holds."""

    num_blocks: int
    kv_cache_bytes: int
    num_state_checkpoints: int = 0
    state_checkpoint_bytes: int = 0
    # Slots of the KV offload tiers (0: off) and the bytes one slot holds.
    num_host_offload_slots: int = 0
    num_disk_offload_slots: int = 0
    offload_block_bytes: int = 0
