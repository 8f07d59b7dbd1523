"""Per-request sampling parameters and the per-row inputs one sampling step needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem_server.sampling.statistics import TokenStatistics


@dataclass(frozen=True)
class SamplingParams:
    """Defaults disable every processor: greedy, no truncation, no penalty, no bias."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # (token id, bias) pairs, each token at most once.
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class SamplingRow:
    """One request sampling its next token: parameters, its token statistics and what it may not pick yet."""

    params: SamplingParams
    # Absolute position the sampled token will occupy in its request (seeds the draw).
    position: int
    # The request's own bias and penalty vectors; set whenever `TokenStatistics.needed(params)`.
    statistics: TokenStatistics | None = None
    # Tokens masked this step (EOS and stop tokens while `min_new_tokens` is not reached).
    banned_ids: tuple[int, ...] = ()
    # Alternatives to report with the chosen token; 0 means none.
    top_logprobs: int = 0
    # Tokens drafted before this draw in the same step: the penalties count them as the request's own.
    drafted: tuple[int, ...] = ()
