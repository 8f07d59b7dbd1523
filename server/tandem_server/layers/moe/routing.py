"""Which experts each token goes to, with what weight, and the token-expert pairs grouped by expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.errors import ConfigError
from tandem_server.layers.linear import ReplicatedLinear


@dataclass(frozen=True)
class RouterConfig:
    """A softmax router: probabilities over all experts, the `top_k` largest kept, renormalised to sum to one when
    `normalize_top_k` (Mixtral always; Qwen-MoE and OLMoE per `norm_topk_prob`)."""

    num_experts: int
    top_k: int
    normalize_top_k: bool

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok is {self.top_k} with {self.num_experts} experts; each token needs between 1 "
                "and that many experts"
            )


@dataclass(frozen=True)
class Routing:
    """Each token's chosen experts `[tokens, top_k]` and their weights (the hidden states' dtype)."""

    experts: torch.Tensor
    weights: torch.Tensor


class TopKRouter(ReplicatedLinear):
    """The router's logits `hidden @ weight.T`; every rank holds it whole and routes the same way."""

    def __init__(self, hidden_size: int, config: RouterConfig) -> None:
        super().__init__(hidden_size, config.num_experts)
        self.config = config

    def route(self, hidden: torch.Tensor) -> Routing:
        """Float32 softmax over every expert, then the top k: the order transformers computes them in, so the same
        experts win ties."""
        probabilities = torch.softmax(self(hidden), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probabilities, self.config.top_k, dim=-1)
        if self.config.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(experts, weights.to(hidden.dtype))


@dataclass(frozen=True)
class ExpertGroups:
    """The token-expert pairs of a step sorted by expert (stably, so each token's pairs stay in expert order)."""

    # Each sorted pair's index among the `[tokens * top_k]` flattened pairs, and its token.
    order: torch.Tensor
    tokens: torch.Tensor
    # int32 `[experts]`: where each expert's run of sorted pairs ends (an expert without pairs has an empty run).
    ends: torch.Tensor


def group_by_expert(experts: torch.Tensor, num_experts: int) -> ExpertGroups:
    """Sorts the pairs of `experts` `[tokens, top_k]` by expert. Every shape follows from the token count alone and
    nothing is read on the host, so the grouping compiles and captures like the rest of a step."""
    flat = experts.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return ExpertGroups(order, order // experts.shape[1], counts.cumsum(0, dtype=torch.int32))
