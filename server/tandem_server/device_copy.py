"""Host-to-device copies that never wait for the device: a step's inputs are copied while the step before runs."""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`. On CUDA it is staged in pinned memory and copied asynchronously: a copy
    from pageable memory would wait for every kernel queued before it. The caching host allocator keeps the pinned
    block until the copy has run."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
