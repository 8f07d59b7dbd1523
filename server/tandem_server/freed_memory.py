"""Hands freed heap pages back to the system: glibc keeps what a burst of allocations freed (a weight conversion, a
compile) for reuse, so the process stays as large as its peak otherwise."""

from __future__ import annotations

import ctypes
import gc


def return_freed_memory() -> None:
    """Collects cyclic garbage, then trims every malloc arena; a no-op where the C library is not glibc."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator decides
        pass
