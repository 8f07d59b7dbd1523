"""The shard flags whose default depends on the device: on where the device gains from them, off elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem_launcher.config import LauncherConfig

DEFAULT_CUDA_GRAPH_SIZES = "1,2,4,8,16,32,64"
DEFAULT_PACKED_GEMM_ROWS = "32"


def cuda_graph_sizes(config: LauncherConfig) -> str:
    """The shard's --cuda-graphs value: the user's sizes, else the defaults on CUDA and "0" (off) on CPU."""
    return _sizes_or_device_default(config.cuda_graphs, DEFAULT_CUDA_GRAPH_SIZES if config.device == "cuda" else "0")


def packed_gemm_rows(config: LauncherConfig) -> str:
    """The shard's --packed-gemm-rows value: the user's row counts, else 32 on CPU and "0" (off) on CUDA."""
    default = DEFAULT_PACKED_GEMM_ROWS if config.device == "cpu" else "0"
    return _sizes_or_device_default(config.packed_gemm_rows, default)


def decode_mirror_memory(config: LauncherConfig) -> str:
    """The shard's --decode-mirror-memory value: the user's size, else "auto" (half the KV cache's) on CPU and "0"
    on CUDA."""
    if config.decode_mirror_memory is not None:
        return config.decode_mirror_memory
    return "auto" if config.device == "cpu" else "0"


def _sizes_or_device_default(sizes: str | None, default: str) -> str:
    # Comma-separated sizes without spaces; "0" (none) for an empty list.
    if sizes is None:
        return default
    sizes = sizes.replace(" ", "")
    return "0" if sizes in ("", "0") else sizes
