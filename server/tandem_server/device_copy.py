"""Copies between host and device that never wait for the device: a step's inputs are copied while the step before
runs, and its results leave the device before the next step is queued."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`. On CUDA it is staged in pinned memory and copied asynchronously: a copy
    from pageable memory would wait for every kernel queued before it. The caching host allocator keeps the pinned
    block until the copy has run."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class HostCopy:
    """A device tensor on its way to host memory; `wait` blocks until that copy alone has landed.

    Invariant: `source` stays referenced until `wait` returns, so the caching allocator cannot reuse its memory
    while the copy still reads it.
    """

    source: torch.Tensor
    host: torch.Tensor
    done: torch.cuda.Event | None

    def wait(self) -> torch.Tensor:
        """The host copy, once it is complete."""
        if self.done is not None:
            self.done.synchronize()
        return self.host


def start_host_copy(tensor: torch.Tensor, device: torch.device) -> HostCopy:
    """Queues `tensor`'s copy (on `device`) into pinned host memory behind the work already queued, and an event
    after it. On the CPU the tensor already is on the host."""
    if device.type != "cuda":
        return HostCopy(tensor, tensor, None)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return HostCopy(tensor, host, done)
