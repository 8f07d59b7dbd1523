"""Tensor-parallel process group: gloo on CPU, NCCL on CUDA, from explicit rank/world flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from tandem_server.errors import ConfigError
from tandem_server.preflight import RendezvousError, await_every_rank, check_collective, where
from tandem_server.rendezvous import bind_collectives_to_loopback, rendezvous_store

# How long ranks wait for each other in a collective once the group has formed.
_GROUP_TIMEOUT = timedelta(minutes=10)
# How long ranks wait for each other to arrive, unless --rendezvous-timeout says otherwise.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 600.0


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
    """This process's place in the tensor-parallel group; world_size 1 needs no process group. Under
    `expert_parallel` each rank holds whole routed experts (a contiguous share of them) instead of a slice of every
    expert's features; everything else splits as without it."""

    rank: int = 0
    world_size: int = 1
    expert_parallel: bool = False

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

    def expert_run(self, num_experts: int) -> range:
        """The routed experts this rank holds: its contiguous share under expert parallelism, else all of them."""
        if not self.expert_parallel or self.world_size == 1:
            return range(num_experts)
        if num_experts < self.world_size:
            raise ConfigError(
                f"--expert-parallel gives each of {self.world_size} shards whole experts, but the model has "
                f"{num_experts} routed experts per layer; use at most {num_experts} shards or no --expert-parallel"
            )
        return self.partition(num_experts)

    def partition_sizes(self, total: int) -> list[int]:
        """Every rank's share of `total`, in rank order."""
        return [len(run) for run in split_evenly(total, self.world_size)]


def rank_device(rank: int, device: str, visible_cuda_devices: int) -> torch.device:
    """The device rank `rank` owns: `cuda:{rank}` (one GPU per rank) or the CPU."""
    if device != "cuda":
        return torch.device("cpu")
    if rank >= visible_cuda_devices:
        raise ConfigError(
            f"rank {rank} needs cuda:{rank} but {visible_cuda_devices} CUDA device(s) are visible; "
            "lower --num-shard or check CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", rank)


@dataclass(frozen=True)
class GroupAddress:
    """Where the ranks meet and how long they wait for each other there."""

    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S


def init_distributed(
    rank: int,
    world_size: int,
    address: GroupAddress,
    device: str,
    local_rank: int | None = None,
    expert_parallel: bool = False,
) -> ParallelContext:
    """Takes this rank's device (by its rank on this node), joins the group of `world_size` ranks at `address`, and
    checks that one all-reduce runs before anything else does.

    NCCL on CUDA (its intra-node transport needs a large /dev/shm), gloo on CPU.
    """
    node_rank = rank if local_rank is None else local_rank
    own_device = rank_device(node_rank, device, torch.cuda.device_count() if device == "cuda" else 0)
    if own_device.type == "cuda":
        torch.cuda.set_device(own_device)
    if world_size > 1:
        _join_group(rank, world_size, address, own_device)
    return ParallelContext(rank=rank, world_size=world_size, expert_parallel=expert_parallel)


def _join_group(rank: int, world_size: int, address: GroupAddress, own_device: torch.device) -> None:
    backend = "nccl" if own_device.type == "cuda" else "gloo"
    bind_collectives_to_loopback(address.master_addr)
    place = where(address.master_addr, address.master_port, backend)
    arrival = timedelta(seconds=address.timeout_s)
    try:
        store = rendezvous_store(address.master_addr, address.master_port, rank, world_size, arrival)
    except (RuntimeError, OSError) as error:
        raise RendezvousError(
            f"rank {rank} could not reach {place} within {address.timeout_s:g}s (rank 0 serves it): {error}"
        ) from error
    await_every_rank(store, rank, world_size, address.timeout_s, place)
    store.set_timeout(_GROUP_TIMEOUT)
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=_GROUP_TIMEOUT,
        # Binding the group to the rank's GPU lets NCCL set up its communicator eagerly.
        device_id=own_device if own_device.type == "cuda" else None,
    )
    check_collective(world_size, own_device, address.timeout_s, place)


def shutdown_distributed() -> None:
    """Leaves the process group if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
