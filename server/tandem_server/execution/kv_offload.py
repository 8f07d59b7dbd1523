"""The KV offload tiers' bytes: a host-memory tier of block-sized slots and an optional disk tier of one file per slot.

The router owns the index (which prefix each slot holds) and sends the copies with each Step; this module only runs
them, in order, before the Step's forward pass. A slot holds one block of every cache tensor (every layer's keys and
values, the draft model's beside the model's), so a block copied out and back is bit-equal.

A disk entry is a header (magic, payload length, CRC-32 of the payload) and the payload, written to a temporary file
and renamed into place; a read whose file is missing, short or fails its checksum is reported, never copied.
"""

from __future__ import annotations

import enum
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tandem_server.errors import ConfigError
from tandem_server.execution.kv_cache import KVCache
from tandem_server.execution.kv_offload_stream import SideStreamCopies
from tandem_server.lazy_zeros import lazy_zeros
from tandem_server.pinned_host import PinnedHostBuffer

_MAGIC = b"TNDMKV01"
_HEADER = struct.Struct("<8sQI")


class Medium(enum.Enum):
    DEVICE = 1
    HOST = 2
    DISK = 3


@dataclass(frozen=True)
class KvTransfer:
    """One block copied from `source` slot `source_index` to `target` slot `target_index`."""

    source: Medium
    source_index: int
    target: Medium
    target_index: int


@dataclass(frozen=True)
class KvOffloadOptions:
    """--kv-offload-memory (bytes of the host tier), and the disk tier: this rank's directory under --kv-offload-dir
    and --kv-offload-disk (its bytes; it needs a directory and a host tier)."""

    host_bytes: int = 0
    disk_dir: Path | None = None
    disk_bytes: int = 0

    def __post_init__(self) -> None:
        if self.host_bytes < 0 or self.disk_bytes < 0:
            raise ConfigError("--kv-offload-memory and --kv-offload-disk must not be negative")
        if self.disk_bytes > 0 and (self.disk_dir is None or self.host_bytes == 0):
            raise ConfigError("a disk offload tier (--kv-offload-dir) needs a host tier: set --kv-offload-memory")


def _cache_tensors(caches: Sequence[KVCache]) -> list[torch.Tensor]:
    """Every tensor a block lives in, `[blocks, ...]` each; a latent layer's value is a view of its key."""
    tensors: list[torch.Tensor] = []
    for cache in caches:
        for layer in cache.layers:
            tensors.append(layer.key)
            if layer.value.data_ptr() != layer.key.data_ptr():
                tensors.append(layer.value)
    return tensors


class KvOffload:
    """Owns the host tier's tensors (one per cache tensor, `[slots, ...]`) and the disk tier's directory."""

    def __init__(self, caches: Sequence[KVCache], options: KvOffloadOptions) -> None:
        self._device_tensors = _cache_tensors(caches)
        self.block_bytes = sum(tensor[0].numel() * tensor.element_size() for tensor in self._device_tensors)
        self.host_slots = options.host_bytes // self.block_bytes if self.block_bytes else 0
        self.disk_slots = options.disk_bytes // self.block_bytes if self.host_slots and options.disk_dir else 0
        device = self._device_tensors[0].device if self._device_tensors else torch.device("cpu")
        on_cuda = device.type == "cuda" and self.host_slots > 0
        # On CUDA pinned, so copies between it and the device need no staging buffer.
        self._pinned = PinnedHostBuffer(self.host_slots * self.block_bytes, "--kv-offload-memory") if on_cuda else None
        self._host_tensors = [self._host_tensor(tensor) for tensor in self._device_tensors] if self.host_slots else []
        self._side_stream = SideStreamCopies(device) if on_cuda else None
        self._disk_dir = options.disk_dir if self.disk_slots else None
        if self._disk_dir is not None:
            self._disk_dir.mkdir(parents=True, exist_ok=True)

    def _host_tensor(self, device_tensor: torch.Tensor) -> torch.Tensor:
        shape = (self.host_slots, *device_tensor.shape[1:])
        if self._pinned is not None:
            return self._pinned.tensor(shape, device_tensor.dtype)
        # Pages become resident as slots are first written.
        return lazy_zeros(shape, device_tensor.dtype, torch.device("cpu"))

    def close(self) -> None:
        """Lands every copy still queued and unpins the host tier; the tiers are not used after."""
        if self._side_stream is not None:
            self._side_stream.finish()
        if self._pinned is not None:
            self._pinned.release()

    def run(self, transfers: Sequence[KvTransfer]) -> tuple[int, ...]:
        """Runs `transfers` in order; the positions of the disk reads that found no intact entry."""
        failed: list[int] = []
        if self._side_stream is not None:
            self._side_stream.collect()
        for start, end in _runs(transfers):
            kind = (transfers[start].source, transfers[start].target)
            run = transfers[start:end]
            if self._side_stream is not None and Medium.DISK in kind:
                # The disk tier reads and writes host slots on the host: their queued saves land first.
                self._side_stream.land([_host_slot(transfer) for transfer in run])
            if kind == (Medium.DISK, Medium.HOST):
                failed.extend(start + offset for offset, transfer in enumerate(run) if not self._read(transfer))
            elif kind == (Medium.HOST, Medium.DISK):
                for transfer in run:
                    self._write(transfer)
            else:
                self._copy(run)
        return tuple(failed)

    def _tensors(self, medium: Medium) -> list[torch.Tensor]:
        if medium == Medium.DEVICE:
            return self._device_tensors
        if medium == Medium.HOST and self._host_tensors:
            return self._host_tensors
        raise ValueError(f"no {medium.name.lower()} tier to copy between")

    def _copy(self, run: Sequence[KvTransfer]) -> None:
        """Copies between the device and host memory, one indexed copy per tensor for the whole run; on CUDA through
        the side stream, on the CPU at once."""
        sources = self._tensors(run[0].source)
        targets = self._tensors(run[0].target)
        source_rows = [transfer.source_index for transfer in run]
        target_rows = [transfer.target_index for transfer in run]
        if self._side_stream is not None:
            if run[0].source == Medium.DEVICE:
                self._side_stream.save(sources, targets, source_rows, target_rows)
            else:
                self._side_stream.load(sources, targets, source_rows, target_rows)
            return
        source_index = torch.tensor(source_rows, dtype=torch.long)
        target_index = torch.tensor(target_rows, dtype=torch.long)
        for source, target in zip(sources, targets, strict=True):
            target.index_copy_(0, target_index, source.index_select(0, source_index))

    def _path(self, slot: int) -> Path:
        if self._disk_dir is None:
            raise ValueError("no disk tier to copy to or from")
        return self._disk_dir / f"{slot}.kv"

    def _write(self, transfer: KvTransfer) -> None:
        payload = b"".join(_as_bytes(tensor[transfer.source_index]) for tensor in self._host_tensors)
        path = self._path(transfer.target_index)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as file:
            file.write(_HEADER.pack(_MAGIC, len(payload), zlib.crc32(payload)))
            file.write(payload)
        os.replace(partial, path)

    def _read(self, transfer: KvTransfer) -> bool:
        """Reads a disk entry into a host slot; False (and nothing copied) when it is missing or torn."""
        try:
            data = self._path(transfer.source_index).read_bytes()
        except OSError:
            return False
        if len(data) < _HEADER.size:
            return False
        magic, length, checksum = _HEADER.unpack_from(data)
        payload = memoryview(data)[_HEADER.size :]
        if magic != _MAGIC or length != len(payload) or length != self.block_bytes or zlib.crc32(payload) != checksum:
            return False
        offset = 0
        for tensor in self._host_tensors:
            row = tensor[transfer.target_index]
            size = row.numel() * row.element_size()
            flat = torch.frombuffer(bytearray(payload[offset : offset + size]), dtype=torch.uint8)
            row.view(-1).view(torch.uint8).copy_(flat)
            offset += size
        return True


def _host_slot(transfer: KvTransfer) -> int:
    return transfer.source_index if transfer.source == Medium.HOST else transfer.target_index


def _as_bytes(row: torch.Tensor) -> bytes:
    return row.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _runs(transfers: Sequence[KvTransfer]) -> list[tuple[int, int]]:
    """`transfers` cut into runs of one kind with distinct targets, in order: within a run the copies commute."""
    runs: list[tuple[int, int]] = []
    start = 0
    targets: set[int] = set()
    for position, transfer in enumerate(transfers):
        first = transfers[start]
        same_kind = (transfer.source, transfer.target) == (first.source, first.target)
        if position > start and (not same_kind or transfer.target_index in targets):
            runs.append((start, position))
            start, targets = position, set()
        targets.add(transfer.target_index)
    if transfers:
        runs.append((start, len(transfers)))
    return runs
