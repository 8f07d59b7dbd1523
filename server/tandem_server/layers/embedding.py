"""Vocab-parallel token embedding and LM head: each rank holds a contiguous slice of the vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.gemm import GemmModule, release_storage
from tandem_server.layers.linear import rank_run
from tandem_server.quant.kernels import QuantizedWeight
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter

_SINGLE_RANK = ParallelContext()


class Embedding(nn.Module):
    """Maps token ids to hidden vectors; a rank looks up only its vocab slice and the ranks sum the results."""

    def __init__(self, vocab_size: int, hidden_size: int, parallel: ParallelContext = _SINGLE_RANK) -> None:
        super().__init__()
        self.parallel = parallel
        self.vocab_size = vocab_size
        self.vocab_range = rank_run(None, vocab_size, parallel, "vocabulary entries")
        part = CheckpointSlice.of(0, self.vocab_range) if parallel.world_size > 1 else None
        self.weight = sliced_parameter((len(self.vocab_range), hidden_size), part)

    # Set when the rows are kept quantized (the float weight is then released).
    quantized: QuantizedWeight | None = None

    def use_quantized(self, quantized: QuantizedWeight) -> None:
        """Looks rows up in `quantized` from now on and releases the float weight's memory."""
        self.quantized = quantized
        release_storage(self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.world_size == 1:
            return self._rows(input_ids)
        start, stop = self.vocab_range.start, self.vocab_range.stop
        # Exactly one rank owns each id and the others add zeros, so the sum equals the single-rank lookup bit for bit.
        owned = (input_ids >= start) & (input_ids < stop)
        local_ids = torch.where(owned, input_ids - start, torch.zeros_like(input_ids))
        hidden = self._rows(local_ids).masked_fill_(~owned.unsqueeze(-1), 0.0)
        return self.parallel.all_reduce(hidden)

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return self.quantized.rows(ids, self.weight.dtype)
        return F.embedding(ids, self.weight)


@dataclass(frozen=True)
class InputEmbeddings:
    """Rows of a step whose input is given rather than their token's embedding (an image's positions): row
    `rows[i]` runs on `values[i]`, a vector of the model's hidden size. Every rank holds all of them."""

    rows: torch.Tensor
    values: torch.Tensor

    def written_into(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` `[tokens, hidden]` with the given rows replaced."""
        return hidden.index_copy(0, self.rows, self.values.to(hidden.dtype))


class LMHead(GemmModule):
    """Projects hidden states to float32 logits over the whole vocabulary; may share the embedding's weight.

    Each rank computes its vocab slice; the slices are all-gathered so every rank holds (and samples) the same logits.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tied_to: Embedding | None,
        parallel: ParallelContext = _SINGLE_RANK,
    ) -> None:
        super().__init__()
        self.parallel = parallel
        self.vocab_sizes = parallel.partition_sizes(vocab_size)
        if tied_to is not None:
            if tied_to.parallel != parallel or tied_to.vocab_size != vocab_size:
                raise ValueError("a tied LM head must split the vocabulary exactly as its embedding does")
            self.weight = tied_to.weight
        else:
            vocab_range = rank_run(None, vocab_size, parallel, "vocabulary entries")
            part = CheckpointSlice.of(0, vocab_range) if parallel.world_size > 1 else None
            self.weight = sliced_parameter((len(vocab_range), hidden_size), part)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.gemm(hidden, None).float()
        return self.parallel.all_gather_last_dim(local, self.vocab_sizes)
