"""Which attention heads a tensor-parallel rank owns: whole GQA groups, or part of one group's query heads."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_server.distributed import ParallelContext, split_evenly
from tandem_server.errors import ConfigError


@dataclass(frozen=True)
class HeadPartition:
    """This rank's contiguous query heads and the contiguous KV heads they read.

    Invariant: every local KV head serves the same number of local query heads, so grouped attention over the
    local heads alone is exact.
    """

    query_heads: range
    kv_heads: range
    head_dim: int

    @property
    def num_heads(self) -> int:
        return len(self.query_heads)

    @property
    def num_kv_heads(self) -> int:
        return len(self.kv_heads)

    @property
    def query_features(self) -> range:
        """This rank's rows of q_proj (and columns of o_proj)."""
        return range(self.query_heads.start * self.head_dim, self.query_heads.stop * self.head_dim)

    @property
    def kv_features(self) -> range:
        """This rank's rows of k_proj and v_proj."""
        return range(self.kv_heads.start * self.head_dim, self.kv_heads.stop * self.head_dim)


def partition_heads(num_heads: int, num_kv_heads: int, head_dim: int, parallel: ParallelContext) -> HeadPartition:
    """Splits attention by whole GQA groups when there are at least as many KV heads as ranks, else replicates.

    With K KV heads on W ranks: K >= W gives each rank a contiguous run of KV heads (runs differ by at most one)
    with all their query heads; K < W gives each KV head to a contiguous run of ranks that split its query heads.
    """
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ConfigError(f"{num_heads} attention heads cannot be grouped over {num_kv_heads} key/value heads")
    if parallel.world_size > num_heads:
        raise ConfigError(
            f"{parallel.world_size} shards but the model has only {num_heads} attention heads; "
            f"use at most {num_heads} shards"
        )
    group = num_heads // num_kv_heads
    if num_kv_heads >= parallel.world_size:
        kv = parallel.partition(num_kv_heads)
        return HeadPartition(range(kv.start * group, kv.stop * group), kv, head_dim)
    # Fewer KV heads than ranks: ranks per KV head is at most ceil(W / K) <= group, so every rank gets a query head.
    for kv_head, ranks in enumerate(split_evenly(parallel.world_size, num_kv_heads)):
        if parallel.rank in ranks:
            local = split_evenly(group, len(ranks))[parallel.rank - ranks.start]
            first = kv_head * group
            return HeadPartition(range(first + local.start, first + local.stop), range(kv_head, kv_head + 1), head_dim)
    raise ConfigError(f"rank {parallel.rank} is outside world size {parallel.world_size}")
