"""gpt-oss's router: a biased linear layer whose top-k logits are softmaxed among themselves."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_server.layers.moe.routing import RouterConfig, Routing
from tandem_server.weights.slicing import sliced_parameter


class TopKLogitsRouter(torch.nn.Module):
    """The router's logits `hidden @ weight.T + bias`, whole on every rank; each token's `top_k` largest pick its
    experts and their softmax (over those k alone) weights them, in the hidden states' dtype as transformers does."""

    def __init__(self, hidden_size: int, config: RouterConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = sliced_parameter((config.num_experts, hidden_size), None)
        self.bias = sliced_parameter((config.num_experts,), None)

    def route(self, hidden: torch.Tensor) -> Routing:
        """The top k by logit (ties go to the lower expert, as in `torch.topk`), softmaxed among themselves."""
        logits = F.linear(hidden, self.weight, self.bias)
        top_logits, experts = torch.topk(logits, self.config.top_k, dim=-1)
        return Routing(experts, torch.softmax(top_logits, dim=-1))
