"""Per-request sampling tensors, built once when a request arrives and updated in place by each generated token."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.device_copy import to_device
from tandem_server.sampling.params import SamplingParams


class TokenStatistics:
    """What one request's logit bias and penalties read, as dense vectors over the vocabulary on the device.

    Each step's processors only stack these rows; nothing is rebuilt from the request's whole history or bias list.
    A vector exists only when the request's parameters use it. Every update is a device-side write, so a token
    still on the device (sampled by a step whose draws the host has not read) is counted without waiting for it.
    """

    def __init__(
        self,
        params: SamplingParams,
        token_ids: Sequence[int],
        prompt_len: int,
        vocab_size: int,
        device: torch.device,
    ) -> None:
        self.bias: torch.Tensor | None = None
        # Prompt and generated tokens (repetition penalty).
        self.seen: torch.Tensor | None = None
        # Generated tokens only (frequency and presence penalties).
        self.output_counts: torch.Tensor | None = None
        # Tokens counted from the device before the host read them: their `record` calls count nothing again.
        self._counted_ahead = 0
        if params.logit_bias:
            tokens = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
            values = torch.tensor([bias for _, bias in params.logit_bias], dtype=torch.float32)
            self.bias = to_device(torch.zeros(vocab_size, dtype=torch.float32).index_add_(0, tokens, values), device)
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(vocab_size, dtype=torch.bool)
            seen[torch.tensor(list(token_ids), dtype=torch.long)] = True
            self.seen = to_device(seen, device)
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            generated = torch.tensor(list(token_ids[prompt_len:]), dtype=torch.long)
            counts = torch.zeros(vocab_size, dtype=torch.float32)
            self.output_counts = to_device(counts.index_add_(0, generated, torch.ones(len(generated))), device)

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        """True when the parameters use any of the vectors (most requests use none)."""
        penalised = params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
        return bool(params.logit_bias) or penalised or params.presence_penalty != 0.0

    def record(self, token_id: int) -> None:
        """Counts a generated token the host has read, unless `record_on_device` already counted it."""
        if self._counted_ahead:
            self._counted_ahead -= 1
            return
        if self.seen is not None:
            self.seen[token_id] = True
        if self.output_counts is not None:
            self.output_counts[token_id] += 1.0

    def record_on_device(self, token_id: torch.Tensor) -> None:
        """Counts a generated token that is still on the device (a one-element int64 tensor); the host's `record`
        of the same token, when it reads it, then counts nothing."""
        if self.seen is not None:
            self.seen.index_fill_(0, token_id, True)
        if self.output_counts is not None:
            self.output_counts.index_add_(0, token_id, torch.ones_like(token_id, dtype=self.output_counts.dtype))
        self._counted_ahead += 1
