"""Logits processors applied to every row, greedy or not: bias, bans and penalties (OpenAI and HF rules)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.sampling.params import SamplingRow


def _pairs(rows: Sequence[tuple[int, Sequence[int]]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    row_index = [row for row, ids in rows for _ in ids]
    token_index = [token for _, ids in rows for token in ids]
    return (
        torch.tensor(row_index, dtype=torch.long, device=device),
        torch.tensor(token_index, dtype=torch.long, device=device),
    )


class LogitBias:
    """logits[row, token] += bias for every (token, bias) the row's request names."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        pairs = [(r, [t for t, _ in row.params.logit_bias]) for r, row in enumerate(rows)]
        self.rows, self.tokens = _pairs(pairs, device)
        values = [bias for row in rows for _, bias in row.params.logit_bias]
        self.values = torch.tensor(values, dtype=torch.float32, device=device)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(row.params.logit_bias for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put((self.rows, self.tokens), self.values, accumulate=True)


class BannedTokens:
    """Sets banned tokens to -inf (EOS and stop tokens before `min_new_tokens`)."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        self.rows, self.tokens = _pairs([(r, row.banned_ids) for r, row in enumerate(rows)], device)
        self.banned = torch.tensor(float("-inf"), device=device)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(row.banned_ids for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put((self.rows, self.tokens), self.banned.to(logits.dtype))


class RepetitionPenalty:
    """HF rule over prompt and output tokens: positive logits divided by the penalty, negative multiplied."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        self.penalty = torch.tensor([row.params.repetition_penalty for row in rows], device=device).unsqueeze(1)
        self.rows, self.tokens = _pairs([(r, row.token_ids) for r, row in enumerate(rows)], device)
        self.seen = torch.tensor(True, device=device)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(row.params.repetition_penalty != 1.0 for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        seen = torch.zeros_like(logits, dtype=torch.bool).index_put((self.rows, self.tokens), self.seen)
        penalized = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(seen, penalized, logits)


class FrequencyPresencePenalty:
    """OpenAI rule over generated tokens: logit -= frequency * count + presence * (count > 0)."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        self.frequency = torch.tensor([row.params.frequency_penalty for row in rows], device=device).unsqueeze(1)
        self.presence = torch.tensor([row.params.presence_penalty for row in rows], device=device).unsqueeze(1)
        self.rows, self.tokens = _pairs([(r, row.output_ids) for r, row in enumerate(rows)], device)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(row.params.frequency_penalty != 0.0 or row.params.presence_penalty != 0.0 for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(self.rows.shape, dtype=logits.dtype, device=logits.device)
        counts = torch.zeros_like(logits).index_put((self.rows, self.tokens), ones, accumulate=True)
        return logits - self.frequency * counts - self.presence * (counts > 0).to(logits.dtype)


# Applied in this order; bias first so penalties see the biased logits, bans last so nothing revives them.
PROCESSORS = (LogitBias, RepetitionPenalty, FrequencyPresencePenalty, BannedTokens)
