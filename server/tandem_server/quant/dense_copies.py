"""Dense bfloat16 copies of a quantized model's CPU GEMM weights, which batches of `DENSE_COPY_MIN_ROWS` rows or more
multiply by (`--quantized-dense-memory`): single streams keep reading the few bytes of the quantized weights, batches
and prefill chunks get the bfloat16 matrix instructions.

Copies are made in the model's module order while they fit the memory given; a weight past that keeps its quantized
kernel at every batch size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tandem_server.layers.gemm import DENSE_COPY_MIN_ROWS, DenseCopy, GemmModule, OneDnnPackedWeight
from tandem_server.quant.kernels import dense_values

_MEMINFO = Path("/proc/meminfo")
_CGROUP_DIR = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class DenseCopies:
    """What `add_dense_copies` made: how many copies, how many quantized weights it left without one, their bytes."""

    made: int = 0
    left: int = 0
    nbytes: int = 0

    def describe(self) -> str:
        return (
            f"bfloat16 copies for batches of {DENSE_COPY_MIN_ROWS}+ rows: {self.made} weights, {self.left} left "
            f"quantized only ({self.nbytes / 2**20:.1f} MiB)"
        )


def unavailable_reason(auto: bool) -> str | None:
    """None when dense copies can serve here; `auto` also asks for bfloat16 matrix instructions, without which the
    quantized kernels stay the faster choice."""
    unavailable = OneDnnPackedWeight.unavailable_reason()
    if unavailable is not None:
        return unavailable
    if auto and not (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()):
        return "this CPU has no bfloat16 matrix instructions (AMX or AVX-512 BF16)"
    return None


def auto_budget(ranks_on_node: int) -> int:
    """`auto`'s memory: half of what the node has available now, split between its ranks."""
    return available_memory() // (2 * ranks_on_node)


def available_memory() -> int:
    """Bytes the system can give without swapping (MemAvailable; free pages where /proc/meminfo is missing), and no
    more than the process's cgroup (a container's memory limit) still allows."""
    system = _meminfo_available()
    headroom = _cgroup_headroom()
    return system if headroom is None else min(system, headroom)


def _meminfo_available() -> int:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_headroom() -> int | None:
    """The cgroup v2 memory limit less what the cgroup uses; None without a limit."""
    try:
        limit = _CGROUP_DIR.joinpath("memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(_CGROUP_DIR.joinpath("memory.current").read_text()))
    except (OSError, ValueError):
        return None


def has_quantized_gemms(model: nn.Module) -> bool:
    return any(isinstance(module, GemmModule) and module.quantized is not None for module in model.modules())


@torch.inference_mode()
def add_dense_copies(model: nn.Module, budget: int) -> DenseCopies:
    """Gives each quantized CPU GEMM of `model` a bfloat16 copy while their bytes stay within `budget`."""
    made = left = nbytes = 0
    for module in model.modules():
        if not isinstance(module, GemmModule) or module.quantized is None:
            continue
        values = dense_values(module.quantized)
        size = 0 if values is None else values.numel() * torch.bfloat16.itemsize
        if values is None or nbytes + size > budget:
            left += 1
            continue
        module.dense_copy = DenseCopy(values)
        made += 1
        nbytes += size
    return DenseCopies(made, left, nbytes)
