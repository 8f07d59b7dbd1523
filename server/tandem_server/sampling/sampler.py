"""Turns float32 logits into one token per row: processors, then greedy or warped seeded draws."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.device_copy import HostCopy, start_host_copy
from tandem_server.errors import FailureKind
from tandem_server.sampling.batch import SamplingBatch
from tandem_server.sampling.logprobs import TokenLogprobs
from tandem_server.sampling.seeding import generator_noise, hashed_noise


@dataclass(frozen=True)
class SampledTokens:
    """Chosen tokens, their log-probabilities and top alternatives under the raw model distribution."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TokenLogprobs]
    # Rows that could not sample, by row; their token is meaningless and must not be used.
    failures: dict[int, FailureKind]


# Row status codes in the host transfer; 0 is a valid draw.
_ROW_FAILURES = {1.0: FailureKind.NON_FINITE_LOGITS, 2.0: FailureKind.NO_VALID_TOKEN}


@dataclass(frozen=True)
class DeviceSample:
    """A step's draws still on the device: the chosen ids, and everything the host reads packed in one tensor whose
    copy to the host is already queued behind them."""

    token_ids: torch.Tensor
    # Row layout: [status, token id, logprob, top_k alternative ids, top_k alternative logprobs], float64.
    packed: HostCopy
    counts: list[int]
    top_k: int

    def to_host(self) -> SampledTokens:
        """The draws on the host: waits for their copy alone, not for any step queued after them."""
        return _unpack(self.packed.wait().tolist(), self.counts, self.top_k)


class Sampler:
    """Stateless; every random draw comes from the row's (seed, position) noise key."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SampledTokens:
        return self.sample(logits, batch).to_host()

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> DeviceSample:
        """Queues the draws on the device without waiting for them."""
        logits = logits.float()
        # One pass instead of isfinite().all(): a float64 sum of float32 values cannot overflow, so it is finite
        # exactly when every logit of the row is.
        finite = logits.sum(dim=-1, dtype=torch.float64).isfinite()
        # Reported logprobs come from the model alone: no penalty, bias or warper distorts them.
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        for processor in batch.processors:
            logits = processor(logits)
        if batch.token_mask is not None:
            # After every processor, so no bias or penalty revives a token the grammar forbids.
            logits = logits.masked_fill(~batch.token_mask, float("-inf"))
        # The first maximal index, as argmax gives; a row whose own constraints forbid every token has -inf as its
        # best score and samples nothing (its index would say token 0).
        best, chosen = logits.max(dim=-1)
        status = torch.where(finite, torch.where(best == float("-inf"), 2.0, 0.0), 1.0)
        if not batch.all_greedy:
            rows = batch.sampled_index
            warped = logits[rows]
            for warper in batch.warpers:
                warped = warper(warped)
            chosen[rows] = _draw(warped, batch)
        logprobs = raw_logprobs.gather(1, chosen.unsqueeze(1))
        counts = [row.top_logprobs for row in batch.rows]
        top_k = min(max(counts, default=0), raw_logprobs.shape[-1])
        top_values, top_indices = raw_logprobs.topk(top_k, dim=-1)
        # Everything the host needs leaves the device in one transfer; float64 holds token ids and float32
        # logprobs exactly.
        columns = (status.unsqueeze(1), chosen.unsqueeze(1), logprobs, top_indices, top_values)
        packed = torch.cat([column.to(torch.float64) for column in columns], dim=1)
        return DeviceSample(chosen, start_host_copy(packed, batch.device), counts, top_k)


def _unpack(host: list[list[float]], counts: list[int], top_k: int) -> SampledTokens:
    # Row layout: [status, token id, logprob, top_k alternative ids, top_k alternative logprobs].
    alternatives = [
        tuple(zip(map(int, row[3 : 3 + count]), row[3 + top_k : 3 + top_k + count], strict=True))
        for row, count in zip(host, counts, strict=True)
    ]
    return SampledTokens(
        token_ids=[int(row[1]) for row in host],
        logprobs=[row[2] for row in host],
        top_logprobs=alternatives,
        failures={index: _ROW_FAILURES[row[0]] for index, row in enumerate(host) if row[0] != 0.0},
    )


def _draw(warped: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    # Exponential race: argmax(p / Exp(1)) picks token i with probability p_i.
    vocab = warped.shape[-1]
    # Key pairs exist on CUDA alone; elsewhere the logits are on the CPU, where the generators draw.
    if batch.noise_key_pairs is None:
        noise = generator_noise(list(batch.noise_keys), vocab)
    else:
        noise = hashed_noise(batch.noise_key_pairs, vocab)
    return (warped.softmax(dim=-1) / noise).argmax(dim=-1)
