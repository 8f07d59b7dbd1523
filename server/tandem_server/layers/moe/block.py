"""A sparse mixture-of-experts feed-forward block: the router, the routed experts and an optional shared expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.linear import ReplicatedLinear
from tandem_server.layers.mlp import GatedMLP, UngatedMLP
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.logit_router import TopKLogitsRouter
from tandem_server.layers.moe.mxfp4_experts import Mxfp4SwiGLUExperts
from tandem_server.layers.moe.routing import GroupedTopKRouter, RouterConfig, Routing, TopKRouter, build_router
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU, ClampedSwiGLUExperts, expert_shape
from tandem_server.quant.mxfp4.format import BLOCK_VALUES


@dataclass(frozen=True)
class MoeArgs:
    """A family's MoE block: its router, each routed expert's intermediate size, and Qwen2-MoE's shared expert (an
    always-on gated MLP scaled by `sigmoid(shared_expert_gate(x))`; 0: none) or DeepSeek-V3's, GLM-4.5's and
    Nemotron-H's shared experts (one always-on MLP of `n_shared_experts` experts' width, added unscaled; 0: none)."""

    router: RouterConfig
    intermediate_size: int
    shared_intermediate_size: int = 0
    shared_experts_intermediate_size: int = 0
    # gpt-oss: the router has a bias and softmaxes its top-k logits among themselves.
    router_over_top_logits: bool = False
    # gpt-oss: biased experts around this activation instead of `hidden_act`'s, their weights MXFP4 with `mxfp4`.
    clamped_swiglu: ClampedSwiGLU | None = None
    mxfp4: bool = False
    # Nemotron-H: routed and shared experts are ungated, `down(act(up(x)))`; the shared experts and the latent
    # projections carry biases where `mlp_bias` says.
    gated_experts: bool = True
    mlp_bias: bool = False
    # Nemotron-H's `moe_latent_size` (0: none): the routed experts run between `fc1_latent_proj` (hidden -> latent)
    # and `fc2_latent_proj` (latent -> hidden); the router and the shared experts read the hidden states.
    latent_size: int = 0


class SparseMoeBlock(nn.Module):
    """Routes each token to its top-k experts and sums their weighted outputs (plus the shared expert's).

    The routed experts' and the shared expert's partial sums are added on each rank first: the block's one
    all-reduce sums both over ranks, and the biases of the layers summed so are added once, after it.
    `expert_tokens` counts the token-expert pairs each expert received, on the device and without a host read, so
    eager steps, compiled graphs and CUDA graph replays all count; the exported decode package (`torch.export`)
    leaves the count out, as its graph holds no state of the shard."""

    expert_tokens: torch.Tensor

    def __init__(self, hidden_size: int, moe: MoeArgs, hidden_act: str, parallel: ParallelContext) -> None:
        super().__init__()
        self.parallel = parallel
        self.top_k = moe.router.top_k
        self.gate: TopKRouter | GroupedTopKRouter | TopKLogitsRouter = (
            TopKLogitsRouter(hidden_size, moe.router)
            if moe.router_over_top_logits
            else build_router(hidden_size, moe.router)
        )
        self.experts = routed_experts(moe.latent_size or hidden_size, moe, hidden_act, parallel)
        self.fc1_latent_proj: ReplicatedLinear | None = None
        self.fc2_latent_proj: ReplicatedLinear | None = None
        if moe.latent_size:
            self.fc1_latent_proj = ReplicatedLinear(hidden_size, moe.latent_size, moe.mlp_bias)
            self.fc2_latent_proj = ReplicatedLinear(moe.latent_size, hidden_size, moe.mlp_bias)
        self.shared_expert: GatedMLP | None = None
        if moe.shared_intermediate_size:
            self.shared_expert = GatedMLP(hidden_size, moe.shared_intermediate_size, False, hidden_act, parallel)
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1)
        self.shared_experts: GatedMLP | UngatedMLP | None = None
        if moe.shared_experts_intermediate_size:
            mlp = GatedMLP if moe.gated_experts else UngatedMLP
            shared_size = moe.shared_experts_intermediate_size
            self.shared_experts = mlp(hidden_size, shared_size, moe.mlp_bias, hidden_act, parallel)
        self.register_buffer("expert_tokens", torch.zeros(moe.router.num_experts, dtype=torch.int64), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        routing = self.gate.route(hidden)
        if not torch.compiler.is_exporting():
            chosen = routing.experts.reshape(-1)
            self.expert_tokens.index_add_(0, chosen, torch.ones_like(chosen))
        out = self._routed_partial_sum(hidden, routing)
        if self.shared_expert is not None:
            # sigmoid(gate) scales every rank's term alike, so scaling before the sum over ranks is exact.
            out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert.partial_sum(hidden)
        if self.shared_experts is not None:
            out = out + self.shared_experts.partial_sum(hidden)
        out = self.parallel.all_reduce(out)
        for bias in self._biases_after_sum():
            out = out + bias
        return out

    def _routed_partial_sum(self, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        """This rank's term of the routed experts' output. Through latent projections, `fc2_latent_proj` is linear:
        applied without its bias to each rank's term, the terms sum to it applied to the experts' whole sum."""
        if self.fc1_latent_proj is None or self.fc2_latent_proj is None:
            return self.experts(hidden, routing)
        return self.fc2_latent_proj.partial_sum(self.experts(self.fc1_latent_proj(hidden), routing))

    def _biases_after_sum(self) -> list[torch.Tensor]:
        """The biases of the layers whose terms the all-reduce sums: the latent up-projection's and the shared
        experts' down projection's."""
        shared_down = None if self.shared_experts is None else self.shared_experts.down_proj
        layers = (self.fc2_latent_proj, shared_down)
        return [layer.bias for layer in layers if layer is not None and layer.bias is not None]

    def inactive_parameter_count(self) -> int:
        """Elements of this rank's expert weights a token does not read: all but its top-k experts'."""
        experts = self.experts
        return experts.parameter_count() * (experts.num_experts - self.top_k) // experts.num_experts


def routed_experts(
    input_size: int, moe: MoeArgs, hidden_act: str, parallel: ParallelContext
) -> RoutedExperts | ClampedSwiGLUExperts:
    """The block's routed experts over `input_size` features (the hidden or the latent size): `hidden_act`-gated or
    ungated ones, or biased clamped-SwiGLU ones in float or MXFP4."""
    experts = moe.router.num_experts
    if moe.clamped_swiglu is None:
        return RoutedExperts(experts, input_size, moe.intermediate_size, hidden_act, parallel, moe.gated_experts)
    if len(parallel.expert_run(experts)) < experts:
        raise ConfigError(
            "--expert-parallel: biased clamped-SwiGLU experts (gpt-oss) split by features only; start without it"
        )
    if moe.mxfp4:
        shape = expert_shape(experts, input_size, moe.intermediate_size, parallel, BLOCK_VALUES)
        return Mxfp4SwiGLUExperts(shape, moe.clamped_swiglu, parallel)
    shape = expert_shape(experts, input_size, moe.intermediate_size, parallel)
    return ClampedSwiGLUExperts(shape, moe.clamped_swiglu, parallel)
