"""Which experts each token goes to, with what weight, and the token-expert pairs grouped by expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.errors import ConfigError
from tandem_server.layers.linear import ReplicatedLinear
from tandem_server.weights.slicing import load_full

# Experts of each group whose scores rank the group (transformers' constant for grouped top-k).
EXPERTS_RANKING_A_GROUP = 2
# Keeps a renormalisation by a zero sum finite, as the reference adds it.
NORMALIZE_EPSILON = 1e-20


@dataclass(frozen=True)
class GroupedTopK:
    """DeepSeek-V3's and GLM-4.5's selection (`noaux_tc`): sigmoid scores, each expert's plus a correction bias,
    choose the `top_groups` of `num_groups` equal groups whose best two experts score highest, then the top k experts
    inside them. The bias only chooses: the weights are the chosen experts' unbiased scores (renormalised when the
    router says so), times `scaling_factor`. LFM2-MoE's router is the one-group case, with `correction_bias` off where
    its config has no expert bias and its own renormalisation epsilon."""

    num_groups: int
    top_groups: int
    scaling_factor: float = 1.0
    correction_bias: bool = True
    normalize_epsilon: float = NORMALIZE_EPSILON


@dataclass(frozen=True)
class RouterConfig:
    """A softmax router: probabilities over all experts, the `top_k` largest kept, renormalised to sum to one when
    `normalize_top_k` (Mixtral always; Qwen-MoE and OLMoE per `norm_topk_prob`). With `grouped`, the grouped sigmoid
    selection instead."""

    num_experts: int
    top_k: int
    normalize_top_k: bool
    grouped: GroupedTopK | None = None

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok is {self.top_k} with {self.num_experts} experts; each token needs between 1 "
                "and that many experts"
            )
        grouped = self.grouped
        if grouped is None:
            return
        if grouped.num_groups < 1 or self.num_experts % grouped.num_groups:
            raise ConfigError(f"n_group {grouped.num_groups} does not divide {self.num_experts} experts evenly")
        if not 1 <= grouped.top_groups <= grouped.num_groups:
            raise ConfigError(f"topk_group is {grouped.top_groups}; it must be between 1 and n_group")
        per_group = self.num_experts // grouped.num_groups
        if per_group < EXPERTS_RANKING_A_GROUP:
            raise ConfigError(
                f"{per_group} experts per group; grouped routing ranks each group by its best {EXPERTS_RANKING_A_GROUP}"
            )
        if self.top_k > grouped.top_groups * per_group:
            raise ConfigError(
                f"num_experts_per_tok {self.top_k} exceeds the {grouped.top_groups * per_group} experts of the "
                f"topk_group {grouped.top_groups} groups a token may use"
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


class GroupedTopKRouter(nn.Module):
    """The grouped sigmoid router; its weight and correction bias stay float32 whatever the model's dtype, as the
    reference keeps them, and the scores are computed in float32."""

    def __init__(self, hidden_size: int, config: RouterConfig) -> None:
        super().__init__()
        if config.grouped is None:
            raise ValueError("invariant: a grouped router is built from a grouped config")
        self.config = config
        self.grouped = config.grouped
        self.weight = _float32_parameter((config.num_experts, hidden_size))
        if config.grouped.correction_bias:
            self.e_score_correction_bias = _float32_parameter((config.num_experts,))
        else:
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts), persistent=False)

    def route(self, hidden: torch.Tensor) -> Routing:
        """The top k of the biased scores within the best groups, weighted by their unbiased scores."""
        scores = torch.sigmoid(F.linear(hidden.float(), self.weight))
        biased = scores + self.e_score_correction_bias
        tokens, groups = hidden.shape[0], self.grouped.num_groups
        by_group = biased.view(tokens, groups, self.config.num_experts // groups)
        group_scores = by_group.topk(EXPERTS_RANKING_A_GROUP, dim=-1)[0].sum(dim=-1)
        chosen_groups = group_scores.topk(self.grouped.top_groups, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen_groups, True)
        eligible = biased.masked_fill(~group_mask.unsqueeze(-1).expand_as(by_group).reshape(tokens, -1), -torch.inf)
        experts = eligible.topk(self.config.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, experts)
        if self.config.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.grouped.normalize_epsilon)
        return Routing(experts, (weights * self.grouped.scaling_factor).to(hidden.dtype))


def _float32_parameter(shape: tuple[int, ...]) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=torch.float32), requires_grad=False)
    param.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter
    return param


def build_router(hidden_size: int, config: RouterConfig) -> TopKRouter | GroupedTopKRouter:
    """The router `config` describes: softmax top-k, or the grouped sigmoid selection."""
    return TopKRouter(hidden_size, config) if config.grouped is None else GroupedTopKRouter(hidden_size, config)


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
