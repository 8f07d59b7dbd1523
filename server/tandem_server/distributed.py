"""Tensor-parallel process group: gloo on CPU, NCCL on CUDA, from explicit rank/world flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


def split_evenly(total: int, parts: int) -> list[range]:
    """`range(total)` cut into `parts` contiguous runs; the first `total % parts` runs are one longer."""
    base, extra = divmod(total, parts)
    runs, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        runs.append(range(start, stop))
        start = stop
    return runs


@dataclass(frozen=True)
class ParallelContext:
    """This process's place in the tensor-parallel group; world_size 1 needs no process group."""

    rank: int = 0
    world_size: int = 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums `tensor` across ranks in place (a no-op on a single rank)."""
        if self.world_size > 1:
            dist.all_reduce(tensor)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Concatenates every rank's `tensor` along the last dim in rank order; rank r contributes `sizes[r]`."""
        if self.world_size == 1:
            return tensor
        # Collectives need equal shapes, so every contribution is padded to the longest and trimmed after.
        width = max(sizes)
        padded = torch.nn.functional.pad(tensor, (0, width - tensor.shape[-1])).contiguous()
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        return torch.cat([part[..., :size] for part, size in zip(gathered, sizes, strict=True)], dim=-1)

    def partition(self, total: int) -> range:
        """This rank's contiguous share of `total` items (uneven totals give the first ranks one more)."""
        return split_evenly(total, self.world_size)[self.rank]

    def partition_sizes(self, total: int) -> list[int]:
        """Every rank's share of `total`, in rank order."""
        return [len(run) for run in split_evenly(total, self.world_size)]


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> ParallelContext:
    """Joins the process group of `world_size` ranks rendezvousing at `master_addr:master_port`."""
    if world_size > 1:
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=10),
        )
    return ParallelContext(rank=rank, world_size=world_size)


def shutdown_distributed() -> None:
    """Leaves the process group if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
