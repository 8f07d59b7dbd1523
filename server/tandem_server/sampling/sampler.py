"""Turns float32 logits into one token per row: greedy or temperature/top-k/top-p with seeded draws."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.sampling.params import SamplingBatch
from tandem_server.sampling.seeding import exponential_noise
from tandem_server.sampling.warpers import apply_top_k_top_p


@dataclass(frozen=True)
class SampledTokens:
    """Chosen tokens and their log-probabilities under the raw model distribution."""

    token_ids: list[int]
    logprobs: list[float]


class Sampler:
    """Stateless; every random draw comes from the row's (seed, position) generator."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SampledTokens:
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logits.argmax(dim=-1)
        if batch.temperature is not None:
            warped = apply_top_k_top_p(logits / batch.temperature.unsqueeze(1), batch.top_k, batch.top_p)
            rows = [row for row, params in enumerate(batch.params) if not params.greedy]
            chosen[rows] = _draw(warped[rows], [batch.params[r].seed for r in rows], [batch.positions[r] for r in rows])
        logprobs = raw_logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        return SampledTokens(token_ids=chosen.tolist(), logprobs=logprobs.tolist())


def _draw(warped: torch.Tensor, seeds: list[int], positions: list[int]) -> torch.Tensor:
    # Exponential race: argmax(p / Exp(1)) picks token i with probability p_i.
    probs = warped.softmax(dim=-1)
    vocab = warped.shape[-1]
    noise = torch.stack(
        [
            exponential_noise(seed, position, vocab, warped.device)
            for seed, position in zip(seeds, positions, strict=True)
        ]
    )
    return (probs / noise).argmax(dim=-1)
