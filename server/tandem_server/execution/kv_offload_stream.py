"""Copies between the CUDA KV cache and the pinned host tier on a side stream, so a Step's offload copies run beside
the forward passes queued around them instead of making the shard's launch wait for the device.

Invariants:
- A save gathers its blocks on the compute stream, so it reads them after every earlier step wrote them and before
  this step's forward overwrites them. Only the copy to the host runs on the side stream. Its host slots are written
  once that copy has landed: before anything else reads or writes those slots, or at a later Step.
- A load copies the host rows to the device on the side stream and scatters them into the cache on the compute
  stream after waiting for that copy, so the forward that reads the blocks follows it.
- Every buffer a queued copy reads or writes stays referenced until an event says the copy is done: device buffers
  made on one stream and used on the other are never handed back to the allocator early.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device


@dataclass(frozen=True)
class _PendingSave:
    """A save whose copy to the host is queued; `targets[k][target_slots] = staged[k]` once `landed`."""

    gathered: list[torch.Tensor]
    staged: list[torch.Tensor]
    targets: Sequence[torch.Tensor]
    target_slots: tuple[int, ...]
    landed: torch.cuda.Event


@dataclass(frozen=True)
class _PendingLoad:
    """A load's device buffers, made on the side stream, kept until the compute stream's scatter has read them."""

    buffers: list[torch.Tensor]
    scattered: torch.cuda.Event


class SideStreamCopies:
    """Owns the side stream and the copies still on it."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._saves: list[_PendingSave] = []
        self._loads: list[_PendingLoad] = []

    def save(
        self,
        sources: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        rows: Sequence[int],
        slots: Sequence[int],
    ) -> None:
        """Queues device cache `rows` of every tensor of `sources` into host tier `slots` of `targets`."""
        compute = torch.cuda.current_stream(self._device)
        index = to_device(torch.tensor(list(rows), dtype=torch.long), self._device)
        gathered = [source.index_select(0, index) for source in sources]
        ready = torch.cuda.Event()
        ready.record(compute)
        self._stream.wait_event(ready)
        staged = [torch.empty(part.shape, dtype=part.dtype, pin_memory=True) for part in gathered]
        with torch.cuda.stream(self._stream):
            for host, part in zip(staged, gathered, strict=True):
                host.copy_(part, non_blocking=True)
            landed = torch.cuda.Event()
            landed.record(self._stream)
        self._saves.append(_PendingSave(gathered, staged, targets, tuple(slots), landed))

    def load(
        self,
        sources: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        slots: Sequence[int],
        rows: Sequence[int],
    ) -> None:
        """Queues host tier `slots` of every tensor of `sources` into device cache `rows` of `targets`."""
        self.land(slots)
        host_index = torch.tensor(list(slots), dtype=torch.long)
        pinned = [source.index_select(0, host_index).pin_memory() for source in sources]
        with torch.cuda.stream(self._stream):
            buffers = [host.to(self._device, non_blocking=True) for host in pinned]
            arrived = torch.cuda.Event()
            arrived.record(self._stream)
        compute = torch.cuda.current_stream(self._device)
        compute.wait_event(arrived)
        index = to_device(torch.tensor(list(rows), dtype=torch.long), self._device)
        for target, part in zip(targets, buffers, strict=True):
            target.index_copy_(0, index, part)
        scattered = torch.cuda.Event()
        scattered.record(compute)
        self._loads.append(_PendingLoad(buffers, scattered))

    def land(self, slots: Sequence[int]) -> None:
        """Waits for the pending saves into any of host `slots` and writes them, with every save queued before them
        (the order of writes into one slot is kept)."""
        wanted = set(slots)
        last = max((at for at, save in enumerate(self._saves) if wanted.intersection(save.target_slots)), default=-1)
        self._land_first(last + 1)

    def collect(self) -> None:
        """Writes the saves that have landed and drops the loads the compute stream is done with, without waiting."""
        landed = 0
        while landed < len(self._saves) and self._saves[landed].landed.query():
            landed += 1
        self._write_first(landed)
        self._loads = [load for load in self._loads if not load.scattered.query()]

    def finish(self) -> None:
        """Waits for every queued copy and writes every save."""
        self._land_first(len(self._saves))
        for load in self._loads:
            load.scattered.synchronize()
        self._loads.clear()

    def _land_first(self, count: int) -> None:
        """Waits for the first `count` pending saves, in order, and writes them into the host tier."""
        for save in self._saves[:count]:
            save.landed.synchronize()
        self._write_first(count)

    def _write_first(self, count: int) -> None:
        """Writes the first `count` pending saves, which have landed, into the host tier."""
        for save in self._saves[:count]:
            index = torch.tensor(save.target_slots, dtype=torch.long)
            for target, host in zip(save.targets, save.staged, strict=True):
                target.index_copy_(0, index, host)
        del self._saves[:count]
