"""The CPU a benchmark ran on, in the words the README's tables use: its model, cores and matrix instructions."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# The instructions that decide which kernels a CPU runs: bfloat16 and int8 dot products, half-precision, AMX tiles.
AVX512_EXTENSIONS = {"avx512_bf16": "BF16", "avx512_fp16": "FP16", "avx512_vnni": "VNNI"}


@dataclass(frozen=True)
class CpuFeatures:
    """The processor's model name, the cores this process may run on, and its instruction-set flags of interest."""

    model: str
    cores: int
    flags: tuple[str, ...]

    def describe(self) -> str:
        """For example `Intel(R) Xeon(R) Processor, 2 cores: AVX-512 with BF16, FP16 and VNNI, no AMX`."""
        flags = set(self.flags)
        if "avx512f" in flags:
            extensions = [name for flag, name in AVX512_EXTENSIONS.items() if flag in flags]
            vector = "AVX-512" + (" with " + _join(extensions) if extensions else "")
        else:
            vector = "AVX2" if "avx2" in flags else "no AVX2"
        matrix = "AMX" if "amx_tile" in flags else "no AMX"
        return f"{self.model}, {self.cores} cores: {vector}, {matrix}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": self.describe()}


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """The first processor's model name and its vector and matrix flags, from /proc/cpuinfo's text."""
    model = ""
    flags: tuple[str, ...] = ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = tuple(sorted(flag for flag in value.split() if flag.startswith(("avx", "amx"))))
    return model, flags


def cpu_features() -> CpuFeatures:
    """This machine's CPU; the flags are empty where /proc/cpuinfo does not exist."""
    text = CPUINFO.read_text(encoding="utf-8") if CPUINFO.is_file() else ""
    model, flags = parse_cpuinfo(text)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return CpuFeatures(model or platform.processor() or platform.machine(), cores, flags)
