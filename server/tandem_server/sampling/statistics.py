"""Per-request sampling tensors, built once when a request arrives and updated in place by each generated token."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.sampling.params import SamplingParams


class TokenStatistics:
    """What one request's logit bias and penalties read, as dense vectors over the vocabulary on the device.

    Each step's processors only stack these rows; nothing is rebuilt from the request's whole history or bias list.
    A vector exists only when the request's parameters use it.
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
        if params.logit_bias:
            tokens = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
            values = torch.tensor([bias for _, bias in params.logit_bias], dtype=torch.float32)
            self.bias = torch.zeros(vocab_size, dtype=torch.float32).index_add_(0, tokens, values).to(device)
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool)
            self.seen[torch.tensor(list(token_ids), dtype=torch.long)] = True
            self.seen = self.seen.to(device)
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            generated = torch.tensor(list(token_ids[prompt_len:]), dtype=torch.long)
            counts = torch.zeros(vocab_size, dtype=torch.float32)
            self.output_counts = counts.index_add_(0, generated, torch.ones(len(generated))).to(device)

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        """True when the parameters use any of the vectors (most requests use none)."""
        penalised = params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
        return bool(params.logit_bias) or penalised or params.presence_penalty != 0.0

    def record(self, token_id: int) -> None:
        """Counts a generated token; device-side writes only, so sampling keeps its single host sync."""
        if self.seen is not None:
            self.seen[token_id] = True
        if self.output_counts is not None:
            self.output_counts[token_id] += 1.0
