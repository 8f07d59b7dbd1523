"""The adapters resident on a CUDA device: `max_loras` slots per changed GEMM module, filled from the host copies as
steps need them and reused least recently used first."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.lora.adapter import LoraAdapter, LoraDelta
from tandem_server.lora.targets import ModelTargets

# Rows per block of the segmented kernels (`triton_sgmv`): tl.dot's least.
ROW_BLOCK = 16
# Steps with at least this many adapter rows (prompt chunks) run the segmented kernels; fewer (decodes), the
# per-row kernels (`triton_bgmv`), which waste nothing on a segment's partial block.
SEGMENTED_ROWS = 64


@dataclass(frozen=True)
class SlotStack:
    """One GEMM module's slots: `a [slots, projections * max_rank, in]`, `b [slots, out, projections * max_rank]`;
    an adapter's packed delta fills the first columns of its slot, zero beyond (and zero where it changes nothing)."""

    a: torch.Tensor
    b: torch.Tensor


class DeviceSlots:
    """Which adapter holds which slot; a slot changes hands only between steps that need it. Every targetable
    module's slots take num_slots * max_rank * (in + out) elements per projection."""

    def __init__(self, targets: ModelTargets, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device):
        self._targets = targets
        self._num_slots = num_slots
        self._max_rank = max_rank
        self._dtype = dtype
        self._device = device
        # Every targetable module's slots, allocated when the first step runs an adapter; Warmup keeps their
        # bytes (`nbytes`) out of the KV cache's budget.
        self._shapes = {path: self._shape(path) for path in targets.gemms}
        self._stacks: dict[str, SlotStack] | None = None
        # Adapter name -> (slot, the adapter written there), least recently used first.
        self._resident: OrderedDict[str, tuple[int, LoraAdapter]] = OrderedDict()

    def place(self, adapters: Sequence[LoraAdapter]) -> dict[str, int]:
        """The slot of each adapter a step runs (no more than the slots: the step's adapters were counted),
        writing in those not resident over the least recently used others."""
        needed = {adapter.name for adapter in adapters}
        for adapter in adapters:
            resident = self._resident.get(adapter.name)
            if resident is None or resident[1] is not adapter:
                slot = resident[0] if resident is not None else self._free_slot(needed)
                self._write(slot, adapter)
                self._resident[adapter.name] = (slot, adapter)
            self._resident.move_to_end(adapter.name)
        return {adapter.name: self._resident[adapter.name][0] for adapter in adapters}

    def staged(self, adapter: LoraAdapter) -> LoraAdapter:
        """`adapter` as the host keeps it for the slots: in pinned memory on CUDA, so writing it into a slot is an
        asynchronous copy queued behind the steps before it."""
        if self._device.type != "cuda":
            return adapter
        pinned = {path: LoraDelta(delta.a.pin_memory(), delta.b.pin_memory()) for path, delta in adapter.deltas.items()}
        return dataclasses.replace(adapter, deltas=pinned)

    def forget(self, name: str) -> None:
        """Frees the slot of adapter `name` (unloaded)."""
        self._resident.pop(name, None)

    def _free_slot(self, needed: set[str]) -> int:
        taken = {slot for slot, _ in self._resident.values()}
        free = next((slot for slot in range(self._num_slots) if slot not in taken), None)
        if free is not None:
            return free
        evicted = next((name for name in self._resident if name not in needed), None)
        if evicted is None:
            raise ValueError(f"invariant: a step runs at most {self._num_slots} adapters (--max-loras)")
        slot, _ = self._resident.pop(evicted)
        return slot

    @property
    def nbytes(self) -> int:
        """Device bytes of every slot, allocated or not."""
        elements = sum(math.prod(shape_a) + math.prod(shape_b) for shape_a, shape_b in self._shapes.values())
        return elements * self._dtype.itemsize

    @property
    def stacks(self) -> dict[str, SlotStack]:
        """The slot stacks by GEMM module path, allocated (zero) on first use."""
        if self._stacks is None:
            self._stacks = {
                path: SlotStack(
                    torch.zeros(shape_a, dtype=self._dtype, device=self._device),
                    torch.zeros(shape_b, dtype=self._dtype, device=self._device),
                )
                for path, (shape_a, shape_b) in self._shapes.items()
            }
        return self._stacks

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        for path, stack in self.stacks.items():
            stack.a[slot].zero_()
            stack.b[slot].zero_()
            written = adapter.deltas.get(path)
            if written is not None:
                stack.a[slot, : written.a.shape[0]].copy_(written.a, non_blocking=True)
                stack.b[slot, :, : written.b.shape[1]].copy_(written.b, non_blocking=True)

    def _shape(self, path: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        gemm = self._targets.gemms[path]
        width = len(gemm.row_offsets) * self._max_rank
        return (self._num_slots, width, gemm.input_size), (self._num_slots, gemm.output_size, width)


@dataclass(frozen=True)
class RowBlocks:
    """A step's adapter rows sorted by slot (`rows`), and for each block of at most ROW_BLOCK of them: its slot and
    its sorted positions [start, end), never crossing a segment."""

    rows: torch.Tensor
    block_slots: torch.Tensor
    block_starts: torch.Tensor
    block_ends: torch.Tensor

    @classmethod
    def of(cls, rows: torch.Tensor, slots: torch.Tensor, device: torch.device) -> RowBlocks:
        """From host tensors of the adapter rows and their slots; a loop over slots present, never over rows."""
        order = torch.argsort(slots, stable=True)
        rows, slots = rows[order], slots[order]
        present, counts = torch.unique_consecutive(slots, return_counts=True)
        block_slots, starts, ends = [], [], []
        segment_start = 0
        for slot, count in zip(present.tolist(), counts.tolist(), strict=True):
            segment_end = segment_start + count
            block_starts = list(range(segment_start, segment_end, ROW_BLOCK))
            block_slots += [slot] * len(block_starts)
            starts += block_starts
            ends += [segment_end] * len(block_starts)
            segment_start = segment_end
        as_device = lambda values: to_device(torch.tensor(values, dtype=torch.int64), device)  # noqa: E731
        return cls(to_device(rows, device), as_device(block_slots), as_device(starts), as_device(ends))


@dataclass(frozen=True)
class SlottedDeltas:
    """One GEMM module's deltas for a step's adapter rows on CUDA: `rows[i]` runs under the adapter in slot
    `slots[i]` of `stack`; with `blocks` (many rows), through the segmented kernels of `triton_sgmv`, else the
    per-row kernels of `triton_bgmv`."""

    stack: SlotStack
    rows: torch.Tensor
    slots: torch.Tensor
    blocks: RowBlocks | None

    def add(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """In place: on CUDA every weight format returns a new output tensor."""
        # Imported here: Triton is there only where adapters run on CUDA.
        if self.blocks is not None:
            from tandem_server.lora.triton_sgmv import add_segmented_deltas  # noqa: PLC0415

            return add_segmented_deltas(out, x, self.stack.a, self.stack.b, self.blocks)
        from tandem_server.lora.triton_bgmv import add_slotted_deltas  # noqa: PLC0415

        return add_slotted_deltas(out, x, self.stack.a, self.stack.b, self.rows, self.slots)
