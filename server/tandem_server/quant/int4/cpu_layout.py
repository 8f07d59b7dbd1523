"""Where torch's CPU int4 packing (`torch._convert_weight_to_int4pack_for_cpu`) puts each weight value, so packed
weights can be read back (dense copies, embedding lookups) without keeping their unpacked values.

The layout depends on the CPU torch runs on. Rows come in blocks of `block` (32 on AVX2, 64 on AVX-512): within a
block, byte j of input column c holds row j in its low nibble and row j + block/2 in its high nibble, the block's
columns one after another. Rows past the last whole block hold consecutive pairs: byte j of column c holds rows 2j
and 2j + 1. The block size is found once by packing test values with torch itself; a CPU whose packing matches
neither size reads nothing back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

_CANDIDATE_BLOCKS = (32, 64)


@dataclass(frozen=True)
class PackedLayout:
    """torch's int4 packing with rows in blocks of `block`, of an `[out, in]` weight."""

    block: int
    out_features: int
    in_features: int

    @property
    def whole_rows(self) -> int:
        return self.out_features // self.block * self.block

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """Every value 0..15, `[out, in]` (uint8)."""
        flat, whole, inputs = packed.reshape(-1), self.whole_rows, self.in_features
        blocks = flat[: whole * inputs // 2].view(-1, inputs, self.block // 2)
        parts = [torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).transpose(1, 2).reshape(whole, inputs)]
        if whole < self.out_features:
            tail = flat[whole * inputs // 2 :].view(inputs, (self.out_features - whole) // 2)
            parts.append(torch.stack([tail & 0x0F, tail >> 4], dim=-1).reshape(inputs, -1).t())
        return torch.cat(parts)

    def rows(self, packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The values of rows `rows` alone, `[len(rows), in]` (uint8)."""
        half, whole, inputs = self.block // 2, self.whole_rows, self.in_features
        in_tail = rows >= whole
        tail = rows - whole
        # Each row's byte in input column 0, the bytes between its columns, and the shift to its nibble.
        first = torch.where(in_tail, whole * inputs // 2 + tail // 2, rows // self.block * inputs * half + rows % half)
        stride = torch.where(in_tail, (self.out_features - whole) // 2, half)
        shift = torch.where(in_tail, tail % 2, rows % self.block // half) * 4
        positions = first[:, None] + torch.arange(inputs) * stride[:, None]
        return (packed.reshape(-1)[positions] >> shift[:, None].to(torch.uint8)) & 0x0F


@functools.cache
def packed_block() -> int | None:
    """This CPU's int4 packing block, the one of `_CANDIDATE_BLOCKS` whose layout torch's own packing matches (with
    a partial block past the whole ones); None when none does."""
    for block in _CANDIDATE_BLOCKS:
        layout = PackedLayout(block, 2 * block + 16, 64)
        q = torch.randint(0, 16, (layout.out_features, layout.in_features), generator=torch.Generator().manual_seed(0))
        packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        if packed.dtype != torch.uint8 or packed.numel() * 2 != q.numel():
            return None
        everything = torch.arange(layout.out_features)
        if torch.equal(layout.unpack(packed).to(q.dtype), q) and torch.equal(
            layout.rows(packed, everything).to(q.dtype), q
        ):
            return block
    return None
