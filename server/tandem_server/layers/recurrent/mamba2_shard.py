"""Which part of a Mamba-2 layer a tensor-parallel rank holds, and its gated norm over groups that ranks may split.

Ranks split the heads evenly. `B` and `C` follow the groups: when `n_groups` is a multiple of the world size each
rank keeps its own whole groups, else every rank keeps all of them and uses the groups its heads belong to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


@dataclass(frozen=True)
class Mamba2Shard:
    """This rank's heads, the groups whose `B` and `C` it keeps, and the layer's head and group counts."""

    heads: range
    groups: range
    num_heads: int
    num_groups: int

    @classmethod
    def of(cls, num_heads: int, num_groups: int, parallel: ParallelContext) -> Mamba2Shard:
        """The even split of `num_heads` for this rank, or a ConfigError naming the sizes that do not divide."""
        if num_heads % parallel.world_size:
            raise ConfigError(
                f"{parallel.world_size} shards cannot split the Mamba-2 layers' {num_heads} heads evenly; use a "
                f"number of shards that divides {num_heads}"
            )
        whole_groups = num_groups % parallel.world_size == 0
        groups = parallel.partition(num_groups) if whole_groups else range(num_groups)
        return cls(parallel.partition(num_heads), groups, num_heads, num_groups)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_groups

    @property
    def whole_groups(self) -> bool:
        """Whether every group this rank's heads touch lies on this rank alone."""
        return len(self.heads) == len(self.groups) * self.heads_per_group

    def head_features(self, head_dim: int) -> range:
        """This rank's channels of a `[heads · head_dim]` tensor."""
        return range(self.heads.start * head_dim, self.heads.stop * head_dim)

    def group_features(self, state_size: int) -> range:
        """This rank's rows of a `[groups · state_size]` tensor (`B` or `C`)."""
        return range(self.groups.start * state_size, self.groups.stop * state_size)

    def per_head(self, kept: torch.Tensor) -> torch.Tensor:
        """`[tokens, heads on this rank, ...]`: each head's group's entry of `kept`, `[tokens, kept groups, ...]`."""
        per_group = self.heads_per_group
        first = self.heads.start // per_group
        last = (self.heads.stop - 1) // per_group + 1
        touched = kept[:, first - self.groups.start : last - self.groups.start]
        offset = self.heads.start - first * per_group
        return touched.repeat_interleave(per_group, dim=1)[:, offset : offset + len(self.heads)]


class Mamba2GatedNorm(nn.Module):
    """Mamba-2's output norm: `x · silu(gate)` RMS-normalised over each group's channels, then scaled by `weight`, in
    float32 (the gate comes before the norm, unlike `GatedRMSNorm`), on this rank's heads."""

    def __init__(self, shard: Mamba2Shard, head_dim: int, eps: float, parallel: ParallelContext) -> None:
        super().__init__()
        self.shard, self.head_dim, self.eps, self.parallel = shard, head_dim, eps, parallel
        features = shard.head_features(head_dim)
        self.weight = sliced_parameter((len(features),), CheckpointSlice.of(0, features))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Float32 `[tokens, heads · head_dim]` for `x` and `gate` of that shape."""
        gated = x.float() * F.silu(gate.float())
        if self.shard.whole_groups:
            by_group = gated.unflatten(-1, (len(self.shard.groups), -1))
            normed = F.rms_norm(by_group, (by_group.shape[-1],), None, self.eps).flatten(-2)
        else:
            normed = self._normed_across_ranks(gated)
        return self.weight.float() * normed

    def _normed_across_ranks(self, gated: torch.Tensor) -> torch.Tensor:
        # Each rank sums the squares of its own channels of every group (zero for groups it has no head of); the
        # all-reduced sums are the whole groups', so every rank divides by the mean of squares one shard would.
        shard = self.shard
        by_head = gated.unflatten(-1, (len(shard.heads), self.head_dim))
        head_group = torch.arange(shard.heads.start, shard.heads.stop, device=gated.device) // shard.heads_per_group
        squares = by_head.square().sum(-1)
        group_squares = squares.new_zeros(squares.shape[0], shard.num_groups).index_add_(1, head_group, squares)
        self.parallel.all_reduce(group_squares)
        group_width = shard.heads_per_group * self.head_dim
        scale = torch.rsqrt(group_squares / group_width + self.eps)[:, head_group]
        return (by_head * scale.unsqueeze(-1)).flatten(-2)
