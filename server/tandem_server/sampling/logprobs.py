"""Log-probabilities from the raw model logits: chosen tokens, top-n alternatives, prompt tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

TokenLogprobs = tuple[tuple[int, float], ...]


def top_alternatives(logprobs: torch.Tensor, counts: Sequence[int]) -> list[TokenLogprobs]:
    """For row i, its `counts[i]` most likely (token, logprob), most likely first."""
    k = min(max(counts, default=0), logprobs.shape[-1])
    if k == 0:
        return [() for _ in counts]
    values, indices = logprobs.topk(k, dim=-1)
    values_list, indices_list = values.tolist(), indices.tolist()
    return [
        tuple(zip(indices_list[row][:count], values_list[row][:count], strict=True)) for row, count in enumerate(counts)
    ]


def next_token_logprobs(
    logits: torch.Tensor, next_ids: torch.Tensor, top: int
) -> tuple[list[float], list[TokenLogprobs]]:
    """Row i's log-probability of next_ids[i], and its `top` alternatives (empty when top is 0)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1).tolist()
    alternatives = top_alternatives(logprobs, [top] * len(chosen)) if top > 0 else []
    return chosen, alternatives
