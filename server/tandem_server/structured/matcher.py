"""One request's grammar state: which tokens may come next, advanced by each sampled token."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import llguidance
import llguidance.numpy
import torch

from tandem_server.errors import FailureKind, RequestFailedError

logger = logging.getLogger(__name__)


class GrammarMatcher:
    """Wraps an llguidance matcher; a token outside the mask is never silently accepted.

    Failures end this request alone. The engine's own error text describes its internal state, so it is logged at
    debug level and the request's client reads a short message.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    @property
    def is_complete(self) -> bool:
        """True once nothing but EOS could follow, or EOS was consumed in an accepting state."""
        return self._matcher.is_stopped()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the allowed-token bitmask (32 tokens per int32, low bit first) into `bitmask[row]` of a CPU tensor."""
        # Through llguidance's numpy helpers (a view of the same memory): its torch helpers compile a kernel with
        # torch.compile at import, which loads Dynamo and Inductor into every shard.
        llguidance.numpy.fill_next_token_bitmask(self._matcher, bitmask.numpy(), row)
        # A matcher that hit an engine limit leaves the row untouched (all allowed): never sample from it.
        if self._matcher.is_error():
            self._fail("the grammar engine stopped (a limit of the grammar engine was reached)")

    def fill_bitmask_after(self, bitmask: torch.Tensor, row: int, drafted: Sequence[int]) -> None:
        """The bitmask for the position after `drafted` (tokens drafted past the consumed ones); this matcher is left
        as it was. Behind a draft the grammar forbids, the row allows every token: the mask before that draft
        excludes it, so no draw behind it is ever kept."""
        # On a copy, not by rolling back: llguidance cannot roll back inside a `max_tokens` lexeme (a reasoning
        # budget), and a copy costs about a microsecond.
        ahead = GrammarMatcher(self._matcher.deep_copy(), self.vocab_size)
        if ahead._matcher.try_consume_tokens(list(drafted)) < len(drafted):
            bitmask[row] = -1
        else:
            ahead.fill_bitmask(bitmask, row)

    def advance(self, token_id: int) -> None:
        """Consumes a sampled (or replayed) token; a token the grammar forbids ends the request."""
        if not self._matcher.consume_token(token_id):
            logger.debug("grammar refused token %d", token_id)
            self._fail("a generated token does not continue the grammar")

    def _fail(self, message: str) -> None:
        logger.debug("grammar failure: %s; engine said: %s", message, self._matcher.get_error())
        raise RequestFailedError(FailureKind.GRAMMAR, message)
