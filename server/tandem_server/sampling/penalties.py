"""Logits processors applied to every row, greedy or not: bias, bans and penalties (OpenAI and HF rules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tandem_server.device_copy import to_device
from tandem_server.sampling.params import SamplingParams, SamplingRow
from tandem_server.sampling.statistics import TokenStatistics


def _pairs(rows: Sequence[tuple[int, Sequence[int]]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    row_index = [row for row, ids in rows for _ in ids]
    token_index = [token for _, ids in rows for token in ids]
    return (
        to_device(torch.tensor(row_index, dtype=torch.long), device),
        to_device(torch.tensor(token_index, dtype=torch.long), device),
    )


class _RowsUsing:
    """The rows whose parameters use one processor: their index, and one vector of their statistics stacked."""

    def __init__(self, rows: Sequence[SamplingRow], uses: Callable[[SamplingParams], bool], device: torch.device):
        indices = [r for r, row in enumerate(rows) if uses(row.params)]
        self.index = to_device(torch.tensor(indices, dtype=torch.long), device)
        self.rows = [rows[r] for r in indices]

    def stacked(self, vector: Callable[[TokenStatistics], torch.Tensor | None]) -> torch.Tensor:
        vectors = [vector(row.statistics) if row.statistics is not None else None for row in self.rows]
        if any(v is None for v in vectors):
            raise ValueError("a row whose parameters use bias or penalties must carry their TokenStatistics")
        return torch.stack(vectors)  # type: ignore[arg-type]

    def with_drafted(self, stack: torch.Tensor, count: bool) -> torch.Tensor:
        """`stack`, this step's own copy, with the tokens drafted before each row's draw marked seen (or, with
        `count`, counted once more each): a draw behind drafts is the request's once they are its tokens."""
        drafted = [(r, row.drafted) for r, row in enumerate(self.rows) if row.drafted]
        if not drafted:
            return stack
        index = _pairs(drafted, stack.device)
        ones = torch.ones(len(index[0]), dtype=stack.dtype, device=stack.device)
        return stack.index_put_(index, ones, accumulate=count)

    def column(self, value: Callable[[SamplingParams], float], device: torch.device) -> torch.Tensor:
        values = torch.tensor([value(row.params) for row in self.rows], dtype=torch.float32)
        return to_device(values, device).unsqueeze(1)


class LogitBias:
    """logits[row] += the row's dense bias vector (built once per request)."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        using = _RowsUsing(rows, _uses_bias, device)
        self.index = using.index
        self.bias = using.stacked(lambda statistics: statistics.bias)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(_uses_bias(row.params) for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_add(0, self.index, self.bias.to(logits.dtype))


class BannedTokens:
    """Sets banned tokens to -inf (EOS and stop tokens before `min_new_tokens`)."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        self.rows, self.tokens = _pairs([(r, row.banned_ids) for r, row in enumerate(rows)], device)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(row.banned_ids for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put((self.rows, self.tokens), logits.new_full((), float("-inf")))


class RepetitionPenalty:
    """HF rule over prompt and output tokens: positive logits divided by the penalty, negative multiplied."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        using = _RowsUsing(rows, _uses_repetition, device)
        self.index = using.index
        self.penalty = using.column(lambda params: params.repetition_penalty, device)
        self.seen = using.with_drafted(using.stacked(lambda statistics: statistics.seen), count=False)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(_uses_repetition(row.params) for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        own = logits.index_select(0, self.index)
        penalized = torch.where(own > 0, own / self.penalty, own * self.penalty)
        return logits.index_copy(0, self.index, torch.where(self.seen, penalized, own))


class FrequencyPresencePenalty:
    """OpenAI rule over generated tokens: logit -= frequency * count + presence * (count > 0)."""

    def __init__(self, rows: Sequence[SamplingRow], device: torch.device) -> None:
        using = _RowsUsing(rows, _uses_frequency_or_presence, device)
        self.index = using.index
        self.frequency = using.column(lambda params: params.frequency_penalty, device)
        self.presence = using.column(lambda params: params.presence_penalty, device)
        self.counts = using.with_drafted(using.stacked(lambda statistics: statistics.output_counts), count=True)

    @staticmethod
    def needed(rows: Sequence[SamplingRow]) -> bool:
        return any(_uses_frequency_or_presence(row.params) for row in rows)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        counts = self.counts.to(logits.dtype)
        own = logits.index_select(0, self.index)
        penalised = own - self.frequency * counts - self.presence * (counts > 0).to(logits.dtype)
        return logits.index_copy(0, self.index, penalised)


def _uses_bias(params: SamplingParams) -> bool:
    return bool(params.logit_bias)


def _uses_repetition(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0


def _uses_frequency_or_presence(params: SamplingParams) -> bool:
    return params.frequency_penalty != 0.0 or params.presence_penalty != 0.0


# Applied in this order; bias first so penalties see the biased logits, bans last so nothing revives them.
PROCESSORS = (LogitBias, RepetitionPenalty, FrequencyPresencePenalty, BannedTokens)
