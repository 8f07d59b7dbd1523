"""A step's spans, flat `[tokens, ...]` in the spans' order, laid out per sequence for the chunked recurrent forms."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PaddedSpans:
    """Where each token of a step's spans sits once the spans are padded to the longest: `[sequences, heads,
    longest, ...]`. Padding is zeros, which the chunked forms treat as leaving a sequence's state unchanged."""

    def __init__(self, query_lens: Sequence[int], tokens: int, device: torch.device) -> None:
        num_seqs = len(query_lens)
        lens = torch.tensor(query_lens, dtype=torch.long, device=device)
        self.sequence = torch.repeat_interleave(torch.arange(num_seqs, device=device), lens, output_size=tokens)
        self.column = torch.arange(tokens, device=device) - (torch.cumsum(lens, 0) - lens)[self.sequence]
        self.num_seqs = num_seqs
        self.longest = max(query_lens)

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """`[tokens, heads, ...]` as `[sequences, heads, longest, ...]`."""
        out = flat.new_zeros(self.num_seqs, self.longest, *flat.shape[1:])
        out[self.sequence, self.column] = flat
        return out.transpose(1, 2)

    def flatten(self, padded: torch.Tensor) -> torch.Tensor:
        """`[sequences, heads, longest, ...]` back to the spans' tokens, `[tokens, heads, ...]`."""
        return padded.transpose(1, 2)[self.sequence, self.column]


def decode_only(query_lens: Sequence[int], tokens: int) -> bool:
    """Every span is one token: the token-by-token form serves the step."""
    return max(query_lens) == 1 and len(query_lens) == tokens
