"""A step whose forward pass and sampling are queued on the device and whose results the host has not read yet."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.engine.requests import RequestState
from tandem_server.engine.step import PromptLogprobs, RequestFailure, StepOutput
from tandem_server.engine.timing import StepTimer
from tandem_server.errors import RequestFailedError
from tandem_server.sampling import DeviceSample, SamplingBatch


@dataclass(frozen=True)
class StepSampling:
    """The sampling inputs of one step, and the grammar rows that already failed building their masks."""

    batch: SamplingBatch
    grammar_failures: dict[int, RequestFailedError]


@dataclass(frozen=True)
class PendingRow:
    """A request that samples one token in a launched step: its sampler row and the index of its reserved token."""

    state: RequestState
    token_index: int
    sampler_row: int


@dataclass(frozen=True)
class DraftedRow:
    """A request that ran `drafts` after its last token: sampler rows `sampler_row` .. `sampler_row + len(drafts)`
    draw the tokens at its next 1 + len(drafts) positions."""

    state: RequestState
    drafts: tuple[int, ...]
    sampler_row: int


@dataclass
class LaunchedStep:
    """What completing a launched step needs; `outcome` memoises the completion (its output or its error).

    Invariant: the state of every PendingRow holds a reserved token at `token_index` until the step completes.
    """

    timer: StepTimer
    # The timer of the forward pass before this one, if any ran since Warmup or Reset.
    previous: StepTimer | None
    failures: tuple[RequestFailure, ...]
    prompt_logprobs: tuple[PromptLogprobs, ...]
    rows: tuple[PendingRow | DraftedRow, ...] = ()
    sampling: StepSampling | None = None
    sampled: DeviceSample | None = None
    # Positions in the Step's KV transfers of disk reads that found no intact entry.
    failed_kv_transfers: tuple[int, ...] = ()
    outcome: StepOutput | BaseException | None = None

    def sampled_row(self, state: RequestState) -> int | None:
        """The sampler row of `state`'s token pending in this step, if it has one."""
        if self.outcome is not None:
            return None
        return next((row.sampler_row for row in self.rows if isinstance(row, PendingRow) and row.state is state), None)

    def pending_token(self, state: RequestState) -> torch.Tensor | None:
        """`state`'s token pending in this step, as a one-element tensor on the device, if it has one."""
        row = self.sampled_row(state)
        return None if row is None else self.sampled_ids()[row : row + 1]

    def sampled_ids(self) -> torch.Tensor:
        """The sampled token ids on the device, one per row (meaningless for rows that failed)."""
        assert self.sampled is not None
        return self.sampled.token_ids
