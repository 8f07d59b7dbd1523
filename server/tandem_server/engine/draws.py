"""Applying a step's draws to its requests: one token per plain row, the kept drafts and one token per drafted row."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_server.engine.launched import DraftedRow, PendingRow
from tandem_server.engine.requests import RequestTable
from tandem_server.engine.step import Generation, RequestFailure
from tandem_server.errors import FailureKind, RequestFailedError
from tandem_server.sampling import SampledTokens

_NO_VALID_TOKEN = "the request's constraints (grammar, banned tokens, logit bias) leave no token it may sample"
_NON_FINITE_LOGITS = "the model produced non-finite logits for this request"


@dataclass
class AppliedDraws:
    generations: list[Generation]
    failures: list[RequestFailure]


def apply_draws(
    requests: RequestTable,
    rows: tuple[PendingRow | DraftedRow, ...],
    sampled: SampledTokens,
    grammar_failures: dict[int, RequestFailedError],
) -> AppliedDraws:
    """Generations in row order; a request that fails or finishes is ended in `requests`."""
    applied = AppliedDraws([], [])
    for row in rows:
        state = row.state
        if not requests.holds(state):
            # Ended by the step before this one, or forgotten or replaced by the router since: nobody waits for it.
            continue
        drafts = row.drafts if isinstance(row, DraftedRow) else ()
        for offset in range(len(drafts) + 1):
            sampler_row = row.sampler_row + offset
            token_id = sampled.token_ids[sampler_row]
            try:
                _raise_row_failure(sampler_row, grammar_failures, sampled.failures)
                if isinstance(row, PendingRow):
                    reason = state.resolve_token(row.token_index, token_id)
                else:
                    reason = state.append_generated(token_id)
            except RequestFailedError as error:
                requests.end([state.id])
                applied.failures.append(RequestFailure(state.id, error.kind, str(error)))
                break
            logprob, top = sampled.logprobs[sampler_row], sampled.top_logprobs[sampler_row]
            applied.generations.append(Generation(state.id, token_id, logprob, reason, top))
            if reason is not None:
                requests.end([state.id])
                break
            if offset == len(drafts) or token_id != drafts[offset]:
                break
            # The draft ran at the position its equal draw now holds: its keys and values are the request's own.
            state.num_computed += 1
    return applied


def _raise_row_failure(
    row: int, grammar_failures: dict[int, RequestFailedError], sampler_failures: dict[int, FailureKind]
) -> None:
    # A grammar that failed allows nothing, so the sampler also flags its row: the grammar's reason wins.
    if row in grammar_failures:
        raise grammar_failures[row]
    kind = sampler_failures.get(row)
    if kind is not None:
        message = _NON_FINITE_LOGITS if kind is FailureKind.NON_FINITE_LOGITS else _NO_VALID_TOKEN
        raise RequestFailedError(kind, message)
