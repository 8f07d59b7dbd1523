"""The shard's `auto` device settings, chosen from the device it runs on, each with the reason it logs.

- `--cuda-graphs auto`: decode steps of batches 1, 2, 4, ..., 64 replay CUDA graphs on CUDA; none on CPU.
- `--packed-gemm-rows auto`: decode GEMMs of 32 rows use prepacked weights on CPU; none on CUDA.
- `--decode-mirror-memory auto`: half of `--kv-cache-memory` for contiguous copies of decoding requests' keys and
  values on CPU (with `--kv-cache-memory auto`, three quarters of the cache Warmup sizes); none on CUDA.

A value the user gave is kept as given (the device checks in `ShardConfig` then judge it).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem_server.config import parse_batch_sizes, parse_byte_size

AUTO = "auto"
# Decode batch sizes captured as CUDA graphs by `--cuda-graphs auto` on CUDA.
DEFAULT_CUDA_GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Batch row counts given prepacked weights by `--packed-gemm-rows auto` on CPU (float32 and bfloat16).
DEFAULT_PACKED_GEMM_ROWS = (32,)


@dataclass(frozen=True)
class DeviceSettings:
    """The resolved `--cuda-graphs`, `--packed-gemm-rows` and `--decode-mirror-memory` (bytes; None: three quarters of
    the KV cache `--kv-cache-memory auto` sizes at Warmup)."""

    cuda_graph_sizes: tuple[int, ...]
    packed_gemm_rows: tuple[int, ...]
    decode_mirror_memory: int | None
    reasons: tuple[str, ...]


def choose_device_settings(
    cuda_graphs: str, packed_gemm_rows: str, decode_mirror_memory: str, device: str, kv_cache_memory: int | None
) -> DeviceSettings:
    """Resolves the three flags for a shard on `device` whose KV cache takes `kv_cache_memory` bytes (None: sized
    at Warmup)."""
    graphs, graphs_reason = _cuda_graphs(cuda_graphs, device)
    rows, rows_reason = _packed_gemm_rows(packed_gemm_rows, device)
    mirror, mirror_reason = _decode_mirror(decode_mirror_memory, device, kv_cache_memory)
    shown_mirror = decode_mirror_memory.strip() if decode_mirror_memory.strip() != AUTO else _mebibytes(mirror)
    reasons = (
        f"--cuda-graphs {_sizes(graphs)}: {graphs_reason}",
        f"--packed-gemm-rows {_sizes(rows)}: {rows_reason}",
        f"--decode-mirror-memory {shown_mirror}: {mirror_reason}",
    )
    return DeviceSettings(graphs, rows, mirror, reasons)


def _cuda_graphs(value: str, device: str) -> tuple[tuple[int, ...], str]:
    if value.strip() != AUTO:
        return parse_batch_sizes(value, "--cuda-graphs"), "as given"
    if device == "cuda":
        return DEFAULT_CUDA_GRAPH_SIZES, "decode steps on CUDA replay captured graphs instead of launching each kernel"
    return (), "a CUDA option"


def _packed_gemm_rows(value: str, device: str) -> tuple[tuple[int, ...], str]:
    if value.strip() != AUTO:
        return parse_batch_sizes(value, "--packed-gemm-rows"), "as given"
    if device == "cpu":
        return DEFAULT_PACKED_GEMM_ROWS, "decode batches of up to 32 rows multiply by prepacked weights on CPU"
    return (), "a CPU option"


def _decode_mirror(value: str, device: str, kv_cache_memory: int | None) -> tuple[int | None, str]:
    if value.strip() != AUTO:
        return parse_byte_size(value), "as given"
    if device != "cpu":
        return 0, "a CPU option"
    if kv_cache_memory is None:
        return None, (
            "three quarters of the KV cache, sized with it at Warmup: decode attention on CPU reads contiguous copies"
        )
    return kv_cache_memory // 2, "half of --kv-cache-memory: decode attention on CPU reads contiguous copies"


def _mebibytes(size: int | None) -> str:
    if size is None:
        return AUTO
    return f"{size / 2**20:g}MiB" if size else "0"


def _sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(str(size) for size in sizes) or "0"
