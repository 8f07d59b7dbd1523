"""Tensor-parallel process group: gloo on CPU, NCCL on CUDA, from explicit rank/world flags."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from tandem_server.errors import ConfigError


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

    def shard_size(self, total: int, what: str) -> int:
        """Per-rank share of `total`, which every rank must split evenly."""
        if total % self.world_size != 0:
            raise ConfigError(f"{what} ({total}) is not divisible by the world size ({self.world_size})")
        return total // self.world_size


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
