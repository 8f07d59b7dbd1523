"""Token embedding and LM head, replicated on every rank so all ranks see identical logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.layers.linear import load_full


class Embedding(nn.Module):
    """Maps token ids to hidden vectors."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = load_full

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """Projects hidden states to float32 vocabulary logits; may share its weight with the embedding."""

    def __init__(self, vocab_size: int, hidden_size: int, tied_to: Embedding | None) -> None:
        super().__init__()
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
            self.weight.weight_loader = load_full

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight).float()
