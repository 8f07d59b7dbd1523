"""Per-request state kept across steps, and the checks that keep it consistent with the router."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tandem_server.engine.grid_positions import GridPositions
from tandem_server.engine.images import check_images, image_grids
from tandem_server.engine.step import (
    FinishReason,
    ImageInput,
    NewRequest,
    RequestFailure,
    ScheduledRequest,
    StepInput,
    StoppingCriteria,
)
from tandem_server.errors import FailureKind, InvalidStepError, RequestFailedError, StateMismatchError
from tandem_server.sampling import SamplingParams
from tandem_server.sampling.statistics import TokenStatistics
from tandem_server.structured import GrammarCompiler, GrammarMatcher

_V = TypeVar("_V")

# Stands for a sampled token the host has not read yet; never a valid token id.
PENDING_TOKEN = -1


@dataclass
class RequestState:
    """Everything the shard remembers about one request between steps."""

    id: int
    token_ids: list[int]
    num_output_tokens: int
    sampling: SamplingParams
    stopping: StoppingCriteria
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    block_table: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache; the latest sampled token never is until the next step runs it.
    num_computed: int = 0
    # Has consumed exactly the generated tokens; None for unconstrained requests.
    grammar: GrammarMatcher | None = None
    # Bias and penalty vectors, built at the request's first sampling and updated by every token after it.
    statistics: TokenStatistics | None = None
    # The LoRA adapter every token of the request runs under; empty: the base model.
    lora_adapter: str = ""
    # The prompt's images, whose spans run on their embeddings.
    images: tuple[ImageInput, ...] = ()
    # The images' token grids, where the model's rotary positions follow them; None: rotary positions are sequence
    # positions.
    image_grids: GridPositions | None = None

    @classmethod
    def from_new(
        cls, request: NewRequest, grammar: GrammarMatcher | None = None, grids: GridPositions | None = None
    ) -> RequestState:
        return cls(
            id=request.id,
            token_ids=list(request.token_ids),
            num_output_tokens=request.num_output_tokens,
            sampling=request.sampling,
            stopping=request.stopping,
            top_logprobs=request.top_logprobs,
            prompt_logprobs=request.prompt_logprobs,
            grammar=grammar,
            lora_adapter=request.lora_adapter,
            images=request.images,
            image_grids=grids,
        )

    @property
    def prompt_len(self) -> int:
        """Tokens that were prompted rather than generated (constant across appends)."""
        return len(self.token_ids) - self.num_output_tokens

    def banned_token_ids(self, ahead: int = 0) -> tuple[int, ...]:
        """Tokens that may not be sampled yet: the request's stop tokens, before min_new_tokens. `ahead` counts the
        tokens drawn before this one in the same step (drafts kept)."""
        if self.num_output_tokens + ahead >= self.stopping.min_new_tokens:
            return ()
        return self.stopping.stop_token_ids

    def samples_after(self, num_tokens: int) -> bool:
        """True when running `num_tokens` more brings every token, prompt and generated, through the model."""
        return self.num_computed + num_tokens == len(self.token_ids)

    def append_generated(self, token_id: int) -> FinishReason | None:
        """Records a sampled token and says whether it ends the request."""
        return self.resolve_token(self.reserve_token(), token_id)

    def reserve_token(self) -> int:
        """Holds the place of a token sampled on the device but not yet read by the host: a later step may run
        it (its input id is copied on the device) before `resolve_token` fills it in. Returns its index."""
        self.token_ids.append(PENDING_TOKEN)
        self.num_output_tokens += 1
        return len(self.token_ids) - 1

    @property
    def has_pending_token(self) -> bool:
        return self.token_ids[-1] == PENDING_TOKEN

    def resolve_token(self, index: int, token_id: int) -> FinishReason | None:
        """Fills in the token reserved at `index` and says whether it ends the request: the router decides which
        tokens end a sequence (the model's EOS among them) and lists them all in `stop_token_ids`."""
        self.token_ids[index] = token_id
        if self.statistics is not None:
            self.statistics.record(token_id)
        if self.grammar is not None:
            self.grammar.advance(token_id)
            if self.grammar.is_complete:
                return FinishReason.EOS
        if token_id in self.stopping.stop_token_ids:
            return FinishReason.STOP_TOKEN
        # Tokens reserved after this one are not counted: it is output token number index - prompt_len + 1.
        if index - self.prompt_len + 1 >= self.stopping.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def needs_host_tokens(self) -> bool:
        """True when preparing this request's next sampling reads its generated tokens on the host: a grammar
        advances its matcher on them (penalty vectors count a pending token on the device)."""
        return self.grammar is not None


@dataclass(frozen=True)
class StepLimits:
    """Bounds every scheduled request must respect."""

    block_size: int
    num_blocks: int
    max_positions: int
    # Width of the logits: every token id a request names must be below it.
    vocab_size: int
    # Whether a draft model runs beside the model, so a request may ask it for drafts.
    draft_model: bool = False
    # The LoRA adapters a new request may name, and how many distinct ones a step may run.
    lora_adapters: frozenset[str] = frozenset()
    max_loras: int = 0
    # The token a prompt's image spans hold; None: the model reads text only.
    image_token_id: int | None = None
    # The rows and columns of tokens an image file becomes, where the model's rotary positions follow image grids
    # (M-RoPE); None: image tokens rotate by their sequence positions.
    token_grid: Callable[[bytes], tuple[int, int]] | None = None


@dataclass(frozen=True)
class AppliedStep:
    """The step's (state, num_tokens) in scheduled order, and the new requests that failed on their own."""

    plan: list[tuple[RequestState, int]]
    failures: list[RequestFailure]
    # Draft tokens by request id, for the planned requests that carry some.
    drafts: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # How many drafts the draft model proposes, by request id, for the planned requests that ask for some.
    model_drafts: dict[int, int] = field(default_factory=dict)
    # State checkpoints by request id: restored into a planned request's slot before the step, saved after it.
    state_restores: dict[int, int] = field(default_factory=dict)
    state_saves: dict[int, int] = field(default_factory=dict)


class RequestTable:
    """The shard's requests by id; a Step is checked entirely before any state changes."""

    def __init__(self, grammar_compiler: GrammarCompiler | None = None) -> None:
        self._states: dict[int, RequestState] = {}
        self._grammar_compiler = grammar_compiler
        # Ids the shard ended itself during the current step, and during the one before: the router may have
        # scheduled those again before it learned of their end, and such a span is skipped, never an error.
        self._ended_now: set[int] = set()
        self._ended_before: set[int] = set()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._states

    def holds(self, state: RequestState) -> bool:
        """True while `state` is the registered state of its id (not ended, forgotten or replaced)."""
        return self._states.get(state.id) is state

    def forget(self, request_ids: Iterable[int]) -> None:
        """Drops the given ids; unknown ids are ignored (the shard may have stopped them itself)."""
        for request_id in request_ids:
            self._states.pop(request_id, None)

    def end(self, request_ids: Iterable[int]) -> None:
        """Drops requests the shard ended itself (a finish reason or a failure)."""
        for request_id in request_ids:
            self._states.pop(request_id, None)
            self._ended_now.add(request_id)

    @property
    def ended_before(self) -> frozenset[int]:
        """The requests the shard ended itself in the steps completed since the latest `apply` before this one."""
        return frozenset(self._ended_before)

    def clear(self) -> None:
        self._states.clear()
        self._ended_now.clear()
        self._ended_before.clear()

    def apply(self, step: StepInput, limits: StepLimits) -> AppliedStep:
        """Registers new requests and appends blocks; a new request that cannot run fails alone and is skipped,
        and so is a request the shard ended in the previous step."""
        self._ended_before, self._ended_now = self._ended_now, set()
        self.forget(step.finished)
        incoming, failures = self._check_new(step.new_requests, limits)
        failures.extend(self._end_unloaded_adapters(step.scheduled, limits))
        self._ended_now.update(failure.id for failure in failures)
        skipped = {failure.id for failure in failures}
        scheduled_ids: set[int] = set()
        step_adapters: set[str] = set()
        for scheduled in step.scheduled:
            if scheduled.id in scheduled_ids:
                raise InvalidStepError(f"request {scheduled.id} is scheduled twice")
            scheduled_ids.add(scheduled.id)
            if scheduled.id in skipped:
                continue
            state = incoming.get(scheduled.id) or self._states.get(scheduled.id)
            if state is None and scheduled.id in self._ended_before:
                skipped.add(scheduled.id)
                continue
            if state is None:
                raise StateMismatchError(f"request {scheduled.id} is scheduled but unknown to the shard")
            _check_scheduled(state, scheduled, scheduled.id in incoming, limits)
            step_adapters.add(state.lora_adapter)
        _check_adapter_count(step_adapters - {""}, limits.max_loras)
        self._states.update(incoming)
        plan = []
        drafts, model_drafts, restores, saves = {}, {}, {}, {}
        for scheduled in step.scheduled:
            if scheduled.id in skipped:
                continue
            state = self._states[scheduled.id]
            state.block_table.extend(scheduled.new_block_ids)
            state.num_computed = scheduled.num_computed_tokens
            plan.append((state, scheduled.num_tokens))
            if scheduled.draft_token_ids:
                drafts[scheduled.id] = scheduled.draft_token_ids
            if scheduled.num_model_drafts:
                model_drafts[scheduled.id] = scheduled.num_model_drafts
            if scheduled.restore_state_checkpoint is not None:
                restores[scheduled.id] = scheduled.restore_state_checkpoint
            if scheduled.save_state_checkpoint is not None:
                saves[scheduled.id] = scheduled.save_state_checkpoint
        return AppliedStep(plan, failures, drafts, model_drafts, restores, saves)

    def fail_under_adapters(self, applied: AppliedStep, reasons: Mapping[str, str]) -> AppliedStep:
        """`applied` without the requests under the LoRA adapters `reasons` names: each fails alone, with its
        adapter's reason, and the rest of the step runs."""
        failures = [
            RequestFailure(state.id, FailureKind.ADAPTER_UNAVAILABLE, reasons[state.lora_adapter])
            for state, _ in applied.plan
            if state.lora_adapter in reasons
        ]
        return self.fail_planned(applied, failures)

    def fail_planned(self, applied: AppliedStep, failures: Sequence[RequestFailure]) -> AppliedStep:
        """`applied` without the planned requests `failures` ends: each fails alone and the rest of the step runs."""
        failed = {failure.id for failure in failures}
        self.end(failed)

        def kept(by_id: dict[int, _V]) -> dict[int, _V]:
            return {request_id: value for request_id, value in by_id.items() if request_id not in failed}

        return AppliedStep(
            [(state, num_tokens) for state, num_tokens in applied.plan if state.id not in failed],
            [*applied.failures, *failures],
            kept(applied.drafts),
            kept(applied.model_drafts),
            kept(applied.state_restores),
            kept(applied.state_saves),
        )

    def _end_unloaded_adapters(self, scheduled: Sequence[ScheduledRequest], limits: StepLimits) -> list[RequestFailure]:
        """Running requests whose LoRA adapter was unloaded since they started: each fails alone."""
        failures = [
            RequestFailure(
                state.id,
                FailureKind.INVALID_PARAMETERS,
                f"LoRA adapter {state.lora_adapter!r} was unloaded while the request ran",
            )
            for request in scheduled
            if (state := self._states.get(request.id)) is not None
            and state.lora_adapter
            and state.lora_adapter not in limits.lora_adapters
        ]
        self.end(failure.id for failure in failures)
        return failures

    def _check_new(
        self, requests: Sequence[NewRequest], limits: StepLimits
    ) -> tuple[dict[int, RequestState], list[RequestFailure]]:
        incoming: dict[int, RequestState] = {}
        failures: list[RequestFailure] = []
        for request in requests:
            if request.id in self._states or request.id in incoming:
                raise InvalidStepError(f"request {request.id} is already registered")
            if not request.token_ids:
                raise InvalidStepError(f"request {request.id} has no tokens")
            if request.num_output_tokens > len(request.token_ids):
                raise InvalidStepError(f"request {request.id} has more output tokens than tokens")
            try:
                _check_request_inputs(request, limits)
                grids = image_grids(request, limits.token_grid) if limits.token_grid is not None else None
                incoming[request.id] = RequestState.from_new(request, self._grammar_matcher(request), grids)
            except RequestFailedError as error:
                failures.append(RequestFailure(request.id, error.kind, str(error)))
        return incoming, failures

    def _grammar_matcher(self, request: NewRequest) -> GrammarMatcher | None:
        # A re-admitted request replays the tokens it generated before its preemption.
        if request.grammar is None:
            return None
        if self._grammar_compiler is None:
            raise RequestFailedError(FailureKind.GRAMMAR, "this model serves no grammars (it has no tokenizer.json)")
        generated = request.token_ids[len(request.token_ids) - request.num_output_tokens :]
        return self._grammar_compiler.matcher(request.grammar, generated)


def _check_request_inputs(request: NewRequest, limits: StepLimits) -> None:
    if request.lora_adapter and request.lora_adapter not in limits.lora_adapters:
        raise RequestFailedError(FailureKind.INVALID_PARAMETERS, f"unknown LoRA adapter {request.lora_adapter!r}")
    vocab_size = limits.vocab_size
    # Every id indexes the embedding or a [rows, vocab] tensor: one out of range would fail the whole step.
    named = (
        ("prompt token", request.token_ids),
        ("logit_bias token", [token for token, _ in request.sampling.logit_bias]),
        ("stop token", request.stopping.stop_token_ids),
    )
    for what, ids in named:
        bad = next((token for token in ids if not 0 <= token < vocab_size), None)
        if bad is not None:
            raise RequestFailedError(
                FailureKind.TOKEN_OUT_OF_RANGE, f"{what} id {bad} is outside the vocabulary of {vocab_size} tokens"
            )
    check_images(request, limits.image_token_id)
    _check_sampling(request.sampling)


def _check_sampling(params: SamplingParams) -> None:
    # The router validates these; the shard refuses what no processor can use rather than fail the whole step.
    values = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "typical_p": params.typical_p,
        "repetition_penalty": params.repetition_penalty,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        **{f"logit_bias[{token}]": bias for token, bias in params.logit_bias},
    }
    for name, value in values.items():
        if not math.isfinite(value):
            raise RequestFailedError(FailureKind.INVALID_PARAMETERS, f"{name} must be a finite number")
    positive = params.top_p > 0 and params.typical_p > 0 and params.repetition_penalty > 0
    if params.temperature < 0 or params.min_p < 0 or not positive:
        raise RequestFailedError(FailureKind.INVALID_PARAMETERS, "a sampling parameter is out of its range")


def _check_adapter_count(adapters: set[str], max_loras: int) -> None:
    if len(adapters) > max_loras:
        raise InvalidStepError(
            f"the step runs {len(adapters)} LoRA adapters ({', '.join(sorted(adapters))}); this shard runs at most "
            f"{max_loras} in one step (--max-loras)"
        )


def _check_scheduled(state: RequestState, scheduled: ScheduledRequest, is_new: bool, limits: StepLimits) -> None:
    rid = scheduled.id
    if not is_new and scheduled.num_computed_tokens != state.num_computed:
        raise StateMismatchError(
            f"request {rid}: router says {scheduled.num_computed_tokens} tokens are computed, "
            f"the shard has {state.num_computed}"
        )
    if scheduled.num_tokens < 1:
        raise InvalidStepError(f"request {rid} is scheduled with no tokens")
    if scheduled.restore_state_checkpoint is not None and (not is_new or scheduled.num_computed_tokens == 0):
        raise InvalidStepError(f"request {rid}: only a new request starting after a cached prefix restores a state")
    end = scheduled.num_computed_tokens + scheduled.num_tokens
    if end > len(state.token_ids):
        raise InvalidStepError(f"request {rid}: tokens up to {end} scheduled, it has {len(state.token_ids)}")
    _check_drafts(state, scheduled, end, limits)
    end += scheduled.num_drafts
    if end > limits.max_positions:
        raise InvalidStepError(f"request {rid}: position {end - 1} exceeds the model's {limits.max_positions}")
    bad_blocks = [b for b in scheduled.new_block_ids if b >= limits.num_blocks]
    if bad_blocks:
        raise InvalidStepError(f"request {rid}: block ids {bad_blocks} are outside 0..{limits.num_blocks - 1}")
    num_blocks = len(state.block_table) + len(scheduled.new_block_ids)
    if num_blocks * limits.block_size < end:
        raise InvalidStepError(f"request {rid}: {num_blocks} blocks of {limits.block_size} cannot hold {end} tokens")


def _check_drafts(state: RequestState, scheduled: ScheduledRequest, end: int, limits: StepLimits) -> None:
    drafts = scheduled.draft_token_ids
    if not scheduled.num_drafts:
        return
    rid = scheduled.id
    if drafts and scheduled.num_model_drafts:
        raise InvalidStepError(f"request {rid}: draft tokens and draft-model drafts in one step")
    if scheduled.num_model_drafts and not limits.draft_model:
        raise InvalidStepError(f"request {rid}: draft-model drafts asked of a shard started without a draft model")
    if end != len(state.token_ids) or state.has_pending_token:
        raise InvalidStepError(f"request {rid}: drafts must follow its last token, and that token must be known")
    if state.prompt_logprobs:
        raise InvalidStepError(f"request {rid}: drafts for a request with prompt logprobs")
    bad = next((token for token in drafts if not 0 <= token < limits.vocab_size), None)
    if bad is not None:
        raise InvalidStepError(f"request {rid}: draft token id {bad} is outside the vocabulary of {limits.vocab_size}")
