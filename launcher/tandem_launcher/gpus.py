"""Defaults derived from the machine's GPUs: `--device auto` and an unset `--num-shard`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

# Present on every machine with a loaded NVIDIA driver; its absence means torch would find no GPU either.
NVIDIA_CONTROL_DEVICE = Path("/dev/nvidiactl")


def visible_cuda_devices(environ: Mapping[str, str]) -> int:
    """CUDA devices the shards would see; torch is imported only when a driver or an explicit list is present."""
    if not NVIDIA_CONTROL_DEVICE.exists() and "CUDA_VISIBLE_DEVICES" not in environ:
        return 0
    import torch  # noqa: PLC0415  (slow to import; CPU-only machines never pay for it)

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(requested: str, count_gpus: Callable[[], int]) -> str:
    """`auto` is cuda when a GPU is visible, else cpu; cpu and cuda are kept."""
    if requested != "auto":
        return requested
    return "cuda" if count_gpus() > 0 else "cpu"


def resolve_num_shard(requested: int | None, device: str, count_gpus: Callable[[], int], nnodes: int = 1) -> int:
    """An unset `--num-shard` is one shard per visible GPU on CUDA and one shard on CPU, on each of `nnodes` nodes."""
    if requested is not None:
        return requested
    return (max(1, count_gpus()) if device == "cuda" else 1) * max(1, nnodes)
