"""One step's sampling inputs: only the processors and warpers some row needs, with per-row tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.sampling.params import SamplingRow
from tandem_server.sampling.penalties import PROCESSORS
from tandem_server.sampling.seeding import key_pairs, mix_seed
from tandem_server.sampling.warpers import WARPERS

LogitsTransform = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingBatch:
    """`processors` act on every row; `warpers` act on the rows in `sampled_rows` only, in that order.

    Every tensor is built here, before the forward pass, and copied without waiting for the device, so sampling
    itself never copies from the host.
    """

    rows: tuple[SamplingRow, ...]
    processors: tuple[LogitsTransform, ...]
    sampled_rows: tuple[int, ...]
    warpers: tuple[LogitsTransform, ...]
    # `sampled_rows` on the device, for indexing the logits.
    sampled_index: torch.Tensor
    # Each sampled row's noise key from its (seed, position), and on CUDA the keys' halves on the device.
    noise_keys: tuple[int, ...]
    noise_key_pairs: torch.Tensor | None
    device: torch.device
    # [rows, vocab] bool, True where a token may be sampled (grammar rows); None when no row is constrained.
    token_mask: torch.Tensor | None = None

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], device: torch.device, token_mask: torch.Tensor | None = None
    ) -> SamplingBatch:
        """Instantiates each processor only when some row's parameters make it do something."""
        processors = tuple(kind(rows, device) for kind in PROCESSORS if kind.needed(rows))
        sampled_rows = tuple(i for i, row in enumerate(rows) if not row.params.greedy)
        sampled_params = [rows[i].params for i in sampled_rows]
        warpers = tuple(kind(sampled_params, device) for kind in WARPERS if kind.needed(sampled_params))
        sampled_index = to_device(torch.tensor(sampled_rows, dtype=torch.long), device)
        keys = tuple(mix_seed(rows[i].params.seed, rows[i].position) for i in sampled_rows)
        pairs = to_device(key_pairs(list(keys)), device) if device.type == "cuda" else None
        return cls(tuple(rows), processors, sampled_rows, warpers, sampled_index, keys, pairs, device, token_mask)

    @property
    def all_greedy(self) -> bool:
        return not self.sampled_rows
