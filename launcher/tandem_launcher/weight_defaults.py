"""The CPU defaults chosen from the model and the machine: the weights' format (`--quantize auto`), the activations'
dtype (`--dtype auto`) and the bfloat16 copies of quantized weights that serve batches (`--quantized-dense-memory`).

Each choice carries the reason the launcher prints at start-up. A flag the user set is passed as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tandem_server.weights.gguf_format import has_gguf_blocks

if TYPE_CHECKING:
    from tandem_launcher.config import LauncherConfig

CPUINFO = Path("/proc/cpuinfo")
# Either gives the CPU bfloat16 dot products: bfloat16 matmuls then run at about twice float32's speed.
BFLOAT16_COMPUTE_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class Choice:
    """One shard flag's value and why it has it."""

    flag: str
    value: str
    reason: str

    def describe(self) -> str:
        return f"{self.flag} {self.value}: {self.reason}"


def host_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of this machine's first CPU; empty where /proc/cpuinfo is not readable."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def quantize(config: LauncherConfig, model_path: Path) -> Choice:
    """`auto`: a GGUF model on the CPU serves its own quantized blocks; anything else keeps float weights."""
    if config.quantize != "auto":
        return Choice("--quantize", config.quantize, "as given")
    if config.device != "cpu":
        return Choice("--quantize", "none", "float weights on CUDA (int4 and fp8 are opt-in there)")
    if has_gguf_blocks(model_path):
        return Choice("--quantize", "gguf", "the model is a GGUF: its quantized blocks are served as they are")
    return Choice("--quantize", "none", "the model has no GGUF blocks: float weights")


def dtype(config: LauncherConfig, cpu_flags: frozenset[str] | None = None) -> Choice:
    """`auto`: bfloat16 on CUDA and on CPUs with bfloat16 dot products (AVX-512 BF16 or AMX), else float32."""
    if config.dtype != "auto":
        return Choice("--dtype", config.dtype, "as given")
    if config.device != "cpu":
        return Choice("--dtype", "bfloat16", "CUDA computes in bfloat16")
    features = host_cpu_flags() if cpu_flags is None else cpu_flags
    present = sorted(features & BFLOAT16_COMPUTE_FLAGS)
    if present:
        return Choice("--dtype", "bfloat16", f"the CPU multiplies bfloat16 natively ({', '.join(present)})")
    return Choice("--dtype", "float32", "the CPU has neither AVX-512 BF16 nor AMX, so float32 runs faster")


def quantized_dense_memory(config: LauncherConfig, model_path: Path, cpu_flags: frozenset[str] | None = None) -> Choice:
    """Unset: `auto` (bfloat16 copies within half the available memory, split between shards) where quantized
    weights meet a CPU that multiplies bfloat16 natively; otherwise none."""
    flag = "--quantized-dense-memory"
    if config.quantized_dense_memory is not None:
        return Choice(flag, config.quantized_dense_memory, "as given")
    if config.device != "cpu":
        return Choice(flag, "0", "a CPU option")
    if quantize(config, model_path).value == "none":
        return Choice(flag, "0", "the weights are not quantized")
    features = host_cpu_flags() if cpu_flags is None else cpu_flags
    if not features & BFLOAT16_COMPUTE_FLAGS:
        return Choice(flag, "0", "bfloat16 copies pay only on a CPU with AVX-512 BF16 or AMX")
    if dtype(config, features).value != "bfloat16":
        return Choice(flag, "0", "activations are not bfloat16")
    return Choice(
        flag, "auto", "bfloat16 copies serve batches of 6 or more rows, within half the available memory at most"
    )


def weight_choices(config: LauncherConfig, model_path: Path) -> list[Choice]:
    """The three choices, in the order the shard applies them."""
    features = host_cpu_flags()
    return [quantize(config, model_path), dtype(config, features), quantized_dense_memory(config, model_path, features)]
