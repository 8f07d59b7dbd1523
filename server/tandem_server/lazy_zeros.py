"""Zeroed tensors whose host memory becomes resident only as it is written.

`torch.zeros` on the CPU writes every byte, so a KV cache or decode mirror of N bytes holds N bytes of resident
memory from the start although a shard only ever writes the blocks and rows it fills. A private anonymous mapping
costs nothing until touched instead: the kernel zero-fills each page on its first write, and a page read before any
write maps the shared zero page, which no process is charged for.

Invariant: a tensor from `lazy_zeros` reads as zeros until written, exactly as one from `torch.zeros` does, and its
mapping lives as long as the tensor's storage (`torch.frombuffer` holds a reference to the mapping object, unmapped
when the storage is freed).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import torch


def lazy_zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed contiguous tensor of `shape`; on the CPU its pages become resident as they are written."""
    count = math.prod(shape)
    # mmap refuses an empty mapping; device memory is not paged in on first touch.
    if device.type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    element_size = torch.empty((), dtype=dtype).element_size()
    mapping = mmap.mmap(-1, count * element_size, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(mapping, dtype=dtype).view(tuple(shape))
