"""Prompt log-probabilities: for each chunk, log P(prompt[p] | prompt[:p]) at the positions it can score."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.engine.requests import RequestState
from tandem_server.engine.step import PromptLogprobs
from tandem_server.models.registry import CausalLM
from tandem_server.sampling.logprobs import next_token_logprobs

# Rows turned into logits at once, so a long chunk never materialises [chunk, vocab] in full.
_ROWS_PER_PASS = 256


@dataclass(frozen=True)
class ScoredChunk:
    """A request's chunk in this step: its first hidden row and the positions it covered."""

    state: RequestState
    first_row: int
    start_position: int
    num_tokens: int


def chunk_prompt_logprobs(model: CausalLM, hidden: torch.Tensor, chunk: ScoredChunk) -> PromptLogprobs | None:
    """Row i of a chunk starting at s predicts position s+i+1; only prompt positions are scored."""
    state = chunk.state
    first = chunk.start_position + 1
    end = min(chunk.start_position + chunk.num_tokens, state.prompt_len - 1) + 1
    if end <= first:
        return None
    rows = torch.arange(chunk.first_row, chunk.first_row + end - first, device=hidden.device)
    targets = torch.tensor(state.token_ids[first:end], dtype=torch.long, device=hidden.device)
    logprobs: list[float] = []
    top: list = []
    for offset in range(0, len(rows), _ROWS_PER_PASS):
        logits = model.compute_logits(hidden[rows[offset : offset + _ROWS_PER_PASS]])
        chosen, alternatives = next_token_logprobs(
            logits, targets[offset : offset + _ROWS_PER_PASS], state.top_logprobs
        )
        logprobs.extend(chosen)
        top.extend(alternatives)
    return PromptLogprobs(id=state.id, first_position=first, logprobs=tuple(logprobs), top=tuple(top))
