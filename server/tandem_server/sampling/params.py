"""Per-request sampling parameters and the per-row inputs one sampling step needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
    """One request sampling its next token: parameters, history and what it may not pick yet."""

    params: SamplingParams
    # Absolute position the sampled token will occupy in its request (seeds the draw).
    position: int
    # Prompt followed by generated tokens; `token_ids[:prompt_len]` is the prompt.
    token_ids: Sequence[int] = ()
    prompt_len: int = 0
    # Tokens masked this step (EOS and stop tokens while `min_new_tokens` is not reached).
    banned_ids: tuple[int, ...] = ()
    # Alternatives to report with the chosen token; 0 means none.
    top_logprobs: int = 0

    @property
    def output_ids(self) -> Sequence[int]:
        return self.token_ids[self.prompt_len :]
