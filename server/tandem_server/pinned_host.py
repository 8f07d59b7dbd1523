"""Page-locked host memory of exactly the size asked for.

`torch.empty(..., pin_memory=True)` allocates through torch's caching host allocator, which rounds every block up to
a power of two: a host tier of 40 GiB would pin 64 GiB. A `PinnedHostBuffer` is an anonymous mapping of the exact
size registered with the CUDA runtime instead, so copies between it and the device are asynchronous as from any
pinned memory.

Invariant: the mapping is registered from construction until `release`, and no tensor over it is used after that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tandem_server.errors import ConfigError
from tandem_server.lazy_zeros import lazy_zeros


class PinnedHostBuffer:
    """Owns one registered mapping of `nbytes`; tensors are carved out of it with `tensor`."""

    def __init__(self, nbytes: int, purpose: str) -> None:
        self.nbytes = nbytes
        # An anonymous mapping of exactly `nbytes`, which the tensor's storage keeps alive.
        self._bytes = lazy_zeros((nbytes,), torch.uint8, torch.device("cpu"))
        self._address = self._bytes.data_ptr()
        result = int(torch.cuda.cudart().cudaHostRegister(self._address, nbytes, 0))
        if result != 0:
            raise ConfigError(f"cannot pin {nbytes} bytes of host memory for {purpose} (CUDA error {result})")
        self._registered = True
        self._carved = 0

    def tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """The next unused bytes of the buffer as a contiguous tensor of `shape`."""
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self._carved + size > self.nbytes:
            raise ValueError(f"{size} bytes do not fit in the {self.nbytes - self._carved} left of the pinned buffer")
        tensor = self._bytes[self._carved : self._carved + size].view(dtype).view(tuple(shape))
        self._carved += size
        return tensor

    def release(self) -> None:
        """Unregisters the mapping; its memory is unmapped once the last tensor over it is gone."""
        if self._registered:
            self._registered = False
            torch.cuda.cudart().cudaHostUnregister(self._address)
