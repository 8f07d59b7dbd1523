"""Dense bfloat16 copies of a quantized model's CPU GEMM weights, which batches of `DENSE_COPY_MIN_ROWS` rows or more
multiply by (`--quantized-dense-memory`): single streams keep reading the few bytes of the quantized weights, batches
and prefill chunks get the bfloat16 matrix instructions.

A layer with a copy multiplies by a `DenseCopyFormat`, which dispatches by row count between the quantized weight
and its copy. Copies are made in the model's module order while they fit the memory given; a weight past that keeps
its quantized kernel at every batch size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tandem_server.layers.gemm import GemmModule
from tandem_server.quant.kernels import QuantizedWeight
from tandem_server.quant.packed import ONEDNN_MAX_ROWS, OneDnnPackedWeight

_MEMINFO = Path("/proc/meminfo")
_CGROUP_DIR = Path("/sys/fs/cgroup")
# Measured on 2 AMX cores, every GEMM of the embedded model's 30 layers and LM head with distinct weights: the int4
# kernels took 29 / 48 / 48 / 73 / 254 ms at 4 / 6 / 8 / 12 / 32 rows, the bfloat16 copies 32 / 36 / 33 / 46 / 66 ms.
DENSE_COPY_MIN_ROWS = 6


class DenseCopyFormat:
    """A quantized weight with a oneDNN-packed bfloat16 copy of its values, in the weight's input order: GEMMs of at
    least `DENSE_COPY_MIN_ROWS` rows multiply by the copy, where the bfloat16 matrix instructions outrun the
    weight-only kernels (which multiply one activation row at a time), smaller ones by the quantized weight. The copy
    rounds each value to bfloat16."""

    def __init__(self, quantized: QuantizedWeight, values: torch.Tensor) -> None:
        self.quantized = quantized
        self.copy = OneDnnPackedWeight(values.to(torch.bfloat16), (ONEDNN_MAX_ROWS,))

    @property
    def name(self) -> str:
        return f"{self.quantized.name}, a bfloat16 copy for batches of {DENSE_COPY_MIN_ROWS}+ rows"

    @property
    def nbytes(self) -> int:
        return self.quantized.nbytes + self.copy.nbytes

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] < DENSE_COPY_MIN_ROWS:
            return self.quantized.linear(x, bias)
        out = self.copy.linear(x.to(torch.bfloat16), None, x.shape[0]).to(x.dtype)
        return out if bias is None else out + bias


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
    return any(True for _ in quantized_gemms(model))


def quantized_gemms(model: nn.Module) -> Iterator[tuple[GemmModule, QuantizedWeight]]:
    """Each GEMM module of `model` that multiplies by a quantized weight, with that weight."""
    for module in model.modules():
        if isinstance(module, GemmModule) and module.weight_format.quantized is not None:
            yield module, module.weight_format.quantized


@torch.inference_mode()
def add_dense_copies(model: nn.Module, budget: int) -> DenseCopies:
    """Gives each quantized CPU GEMM of `model` a bfloat16 copy while their bytes stay within `budget`."""
    made = left = nbytes = 0
    for module, quantized in quantized_gemms(model):
        values = quantized.dense_values()
        size = 0 if values is None else values.numel() * torch.bfloat16.itemsize
        if values is None or nbytes + size > budget:
            left += 1
            continue
        module.use_format(DenseCopyFormat(quantized, values))
        made += 1
        nbytes += size
    return DenseCopies(made, left, nbytes)
