"""The step's allowed-token mask for the rows that carry a grammar; unconstrained rows stay all-allowed."""

from __future__ import annotations

from collections.abc import Sequence

import llguidance.torch
import torch

from tandem_server.structured.matcher import GrammarMatcher

_BITS = 32


def grammar_token_mask(
    matchers: Sequence[GrammarMatcher | None], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """A [rows, vocab] bool mask (True = allowed), or None when no row is constrained (the common case is free)."""
    constrained = [(row, matcher) for row, matcher in enumerate(matchers) if matcher is not None]
    if not constrained:
        return None
    bitmask = llguidance.torch.allocate_token_bitmask(len(constrained), vocab_size)
    for index, (_, matcher) in enumerate(constrained):
        matcher.fill_bitmask(bitmask, index)
    shifts = torch.arange(_BITS, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(len(constrained), -1)[:, :vocab_size].bool()
    mask = torch.ones(len(matchers), vocab_size, dtype=torch.bool)
    mask[[row for row, _ in constrained]] = allowed
    return mask.to(device, non_blocking=True)
