"""Contiguous copies of decoding requests' keys and values, so decode attention reads them without a gather.

The paged cache scatters a request's context over blocks, and the `torch` backend would otherwise copy every decoding
request's blocks into one padded batch in every layer of every step. The mirror keeps that padded batch between
steps instead: request r's position p lives at row r, column p of a `[rows, capacity, kv_heads, head_dim]` tensor
per layer, and a step copies in only the positions the row does not hold yet (one per request in steady decode).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tandem_server.layers.attention.backend import LayerCache
from tandem_server.lazy_zeros import lazy_zeros

logger = logging.getLogger(__name__)

# Allocations are whole multiples of these, so reallocation (which recopies every row) stays rare.
ROW_QUANTUM = 8
COLUMN_QUANTUM = 256


@dataclass(frozen=True)
class MirrorGeometry:
    """The shape of one position's keys and values across the layers."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    # Per layer (kv heads, head_dim) where layers differ; None: every layer has (`num_kv_heads`, `head_dim`).
    layer_shapes: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def of(cls, layers: Sequence[LayerCache]) -> MirrorGeometry:
        """The geometry of a paged cache's layers."""
        shapes = tuple((int(layer.key.shape[-2]), int(layer.key.shape[-1])) for layer in layers)
        num_kv_heads, head_dim = shapes[0]
        uniform = all(shape == shapes[0] for shape in shapes)
        return cls(len(layers), num_kv_heads, head_dim, layers[0].key.dtype, None if uniform else shapes)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """(kv heads, head_dim) of every layer."""
        if self.layer_shapes is not None:
            return self.layer_shapes
        return ((self.num_kv_heads, self.head_dim),) * self.num_layers


@dataclass(frozen=True)
class MirroredLayerCache(LayerCache):
    """A paged layer cache with the mirror's tensors for that layer beside it, `[rows, capacity, kv_heads, dim]`."""

    mirror_key: torch.Tensor
    mirror_value: torch.Tensor

    def copy_to_mirror(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copies the keys and values at flat cache slots `sources` to the mirror's flat positions `targets`."""
        for paged, mirror in ((self.key, self.mirror_key), (self.value, self.mirror_value)):
            flat = mirror.view(-1, *mirror.shape[2:])
            flat.index_copy_(0, targets, paged.view(-1, *paged.shape[2:])[sources])


@dataclass(frozen=True)
class MirrorSlot:
    """Where a decoding request sits in the mirror this step: its row and how many leading positions it holds."""

    row: int
    copied: int


@dataclass
class _Resident:
    row: int
    copied: int


class DecodeMirror:
    """Owns the mirror's tensors and which request holds which row; the `torch` backend places, reads and fills them.

    Invariant: after `place`, this step's decoding requests hold exactly rows 0..B-1, so the backend attends over
    the view `[:B, :max_context]` without copying. A row's leading `copied` positions equal the request's cached
    keys and values, because a running request's cache positions are written once and never change.
    """

    def __init__(self, geometry: MirrorGeometry, budget_bytes: int, device: torch.device) -> None:
        self._geometry = geometry
        self._budget_bytes = budget_bytes
        self._device = device
        self._residents: dict[int, _Resident] = {}
        self._rows = 0
        self._capacity = 0
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def bytes_per_position(self) -> int:
        """Keys and values of one token in every layer."""
        geometry = self._geometry
        element_size = torch.empty((), dtype=geometry.dtype).element_size()
        return 2 * sum(kv_heads * head_dim for kv_heads, head_dim in geometry.shapes) * element_size

    @property
    def budget_bytes(self) -> int:
        """The most its tensors may take."""
        return self._budget_bytes

    @property
    def nbytes(self) -> int:
        return self._rows * self._capacity * self.bytes_per_position

    @property
    def capacity(self) -> int:
        """Positions per row."""
        return self._capacity

    def place(self, decodes: Sequence[tuple[int, int]]) -> dict[int, MirrorSlot] | None:
        """Assigns rows 0..B-1 to the step's decoding requests, given as (request id, context length after this
        step), growing the tensors if needed; None when they would exceed the budget (the step gathers instead).

        Requests not decoding this step give up their rows. The returned `copied` counts are what the rows hold
        before the step; the step fills the rest, so afterwards each row holds its whole context.
        """
        if not decodes:
            # No decodes, no rows: the memory goes back until decoding resumes.
            self._residents.clear()
            self._allocate(0, 0)
            return {}
        if not self._fits(len(decodes), max(length for _, length in decodes)):
            return None
        decoding = {request_id for request_id, _ in decodes}
        kept = {
            request_id: resident
            for request_id, resident in self._residents.items()
            if request_id in decoding and resident.row < len(decodes)
        }
        free_rows = iter(sorted(set(range(len(decodes))) - {resident.row for resident in kept.values()}))
        slots = {}
        for request_id, context_len in decodes:
            resident = kept.get(request_id) or _Resident(next(free_rows), 0)
            slots[request_id] = MirrorSlot(resident.row, min(resident.copied, context_len))
            kept[request_id] = _Resident(resident.row, context_len)
        self._residents = kept
        return slots

    def forget(self, request_ids: Iterable[int]) -> None:
        """Drops the rows of requests that finished, were preempted, or arrive anew under a known id."""
        for request_id in request_ids:
            self._residents.pop(request_id, None)

    def clear(self) -> None:
        """Forgets every row (after a reset or a failed step); the tensors stay allocated until the next step."""
        self._residents.clear()

    def attach(self, layers: Sequence[LayerCache]) -> list[LayerCache]:
        """The paged layer caches with this mirror's tensors beside them."""
        return [
            MirroredLayerCache(cache.key, cache.value, mirror_key, mirror_value)
            for cache, (mirror_key, mirror_value) in zip(layers, self._layers, strict=True)
        ]

    def _fits(self, rows: int, context_len: int) -> bool:
        if rows <= self._rows and context_len <= self._capacity:
            return True
        # Sized for this step's need, rounded up as far as the budget allows, not for the largest of each dimension
        # ever seen: 32 short decodes followed by 16 long ones would otherwise hold 32 long rows.
        budget_positions = self._budget_bytes // self.bytes_per_position
        for row_count in (_round_up(rows, ROW_QUANTUM), rows):
            capacity = min(_round_up(context_len, COLUMN_QUANTUM), budget_positions // row_count)
            if capacity >= context_len:
                self._allocate(row_count, capacity)
                logger.info("decode mirror: %d rows x %d positions (%d MiB)", row_count, capacity, self.nbytes >> 20)
                return True
        return False

    def _allocate(self, rows: int, capacity: int) -> None:
        geometry = self._geometry
        self._layers = []  # release the old tensors before allocating the new ones
        # Zeroed, not empty: padding columns are masked out of the softmax, but a NaN bit pattern there would still
        # poison the weighted sum (0 x NaN). Lazily: on the CPU only the positions rows fill become resident.
        if rows and capacity:
            self._layers = [
                (
                    lazy_zeros((rows, capacity, *shape), geometry.dtype, self._device),
                    lazy_zeros((rows, capacity, *shape), geometry.dtype, self._device),
                )
                for shape in geometry.shapes
            ]
        self._rows, self._capacity = rows, capacity
        # The new tensors hold nothing yet: every resident copies its whole context again.
        for resident in self._residents.values():
            resident.copied = 0


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum
