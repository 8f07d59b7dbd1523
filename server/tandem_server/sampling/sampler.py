"""Turns float32 logits into one token per row: processors, then greedy or warped seeded draws."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.sampling.batch import SamplingBatch
from tandem_server.sampling.logprobs import TokenLogprobs, top_alternatives
from tandem_server.sampling.seeding import exponential_noise


@dataclass(frozen=True)
class SampledTokens:
    """Chosen tokens, their log-probabilities and top alternatives under the raw model distribution."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TokenLogprobs]


class Sampler:
    """Stateless; every random draw comes from the row's (seed, position) generator."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SampledTokens:
        logits = logits.float()
        # Reported logprobs come from the model alone: no penalty, bias or warper distorts them.
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        for processor in batch.processors:
            logits = processor(logits)
        if batch.token_mask is not None:
            # After every processor, so no bias or penalty revives a token the grammar forbids.
            logits = logits.masked_fill(~batch.token_mask, float("-inf"))
        chosen = logits.argmax(dim=-1)
        if not batch.all_greedy:
            rows = list(batch.sampled_rows)
            warped = logits[rows]
            for warper in batch.warpers:
                warped = warper(warped)
            seeds = [batch.rows[r].params.seed for r in rows]
            chosen[rows] = _draw(warped, seeds, [batch.rows[r].position for r in rows])
        logprobs = raw_logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        top = top_alternatives(raw_logprobs, [row.top_logprobs for row in batch.rows])
        return SampledTokens(token_ids=chosen.tolist(), logprobs=logprobs.tolist(), top_logprobs=top)


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
