"""The step's allowed-token mask for the rows that carry a grammar; unconstrained rows stay all-allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tandem_server.errors import RequestFailedError
from tandem_server.structured.matcher import GrammarMatcher

_BITS = 32


@dataclass(frozen=True)
class GrammarMask:
    """`allowed` is [rows, vocab] bool (True = may be sampled), None when no row is constrained.

    A row whose grammar failed allows nothing, so the step keeps its shape and the row samples no token; its
    failure is in `failures`, by row.
    """

    allowed: torch.Tensor | None = None
    failures: dict[int, RequestFailedError] = field(default_factory=dict)


def grammar_token_mask(
    matchers: Sequence[GrammarMatcher | None],
    vocab_size: int,
    device: torch.device,
    drafted: Sequence[Sequence[int]] = (),
) -> GrammarMask:
    """The mask for one step's sampling rows (the common, unconstrained case costs nothing). `drafted[row]`, when
    given, holds the tokens drafted before the row's position: its mask is the matcher's after them."""
    constrained = [(row, matcher) for row, matcher in enumerate(matchers) if matcher is not None]
    if not constrained:
        return GrammarMask()
    # All bits set: a row a matcher leaves untouched allows every token.
    bitmask = torch.full((len(constrained), -(-vocab_size // _BITS)), -1, dtype=torch.int32)
    failures: dict[int, RequestFailedError] = {}
    for index, (row, matcher) in enumerate(constrained):
        try:
            if drafted and drafted[row]:
                matcher.fill_bitmask_after(bitmask, index, drafted[row])
            else:
                matcher.fill_bitmask(bitmask, index)
        except RequestFailedError as failure:
            failures[row] = failure
            bitmask[index] = 0
    shifts = torch.arange(_BITS, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(len(constrained), -1)[:, :vocab_size].bool()
    mask = torch.ones(len(matchers), vocab_size, dtype=torch.bool)
    mask[[row for row, _ in constrained]] = allowed
    return GrammarMask(mask.to(device, non_blocking=True), failures)
