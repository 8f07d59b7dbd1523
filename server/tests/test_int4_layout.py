"""Reading torch's packed CPU int4 weights back: every layout torch uses, with and without a partial last block."""

from __future__ import annotations

import pytest
import torch
from tandem_server.quant.int4.cpu_layout import PackedLayout, packed_block


def _values(out_features: int, in_features: int) -> torch.Tensor:
    return torch.randint(0, 16, (out_features, in_features), generator=torch.Generator().manual_seed(out_features))


def _pack_as_documented(q: torch.Tensor, block: int) -> torch.Tensor:
    """torch's packing written out value by value: in a whole block, byte j of a column holds rows j and j + block/2;
    in the partial last block, rows 2j and 2j + 1."""
    out_features, in_features = q.shape
    packed = torch.zeros(out_features * in_features // 2, dtype=torch.uint8)
    for start in range(0, out_features, block):
        size = min(block, out_features - start)
        offset = start * in_features // 2
        for column in range(in_features):
            for byte in range(size // 2):
                low, high = (byte, byte + block // 2) if size == block else (2 * byte, 2 * byte + 1)
                value = q[start + low, column] | (q[start + high, column] << 4)
                packed[offset + column * size // 2 + byte] = value
    return packed


@pytest.mark.parametrize("out_features", [16, 32, 48, 64, 96, 112, 160, 576])
def test_this_cpus_packing_reads_back_exactly(out_features: int) -> None:
    block = packed_block()
    assert block in (32, 64)
    q = _values(out_features, 64)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    layout = PackedLayout(block, out_features, 64)
    assert torch.equal(layout.unpack(packed).long(), q)
    rows = torch.tensor([out_features - 1, 0, out_features // 2, 7])
    assert torch.equal(layout.rows(packed, rows).long(), q[rows])


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("out_features", [16, 48, 80, 128, 144])
def test_both_block_sizes_read_back_their_documented_layout(block: int, out_features: int) -> None:
    q = _values(out_features, 32)
    packed = _pack_as_documented(q, block)
    layout = PackedLayout(block, out_features, 32)
    assert torch.equal(layout.unpack(packed).long(), q)
    rows = torch.arange(out_features).flip(0)
    assert torch.equal(layout.rows(packed, rows).long(), q[rows])


def test_the_documented_layout_is_the_one_torch_packs_on_this_cpu() -> None:
    block = packed_block()
    assert block is not None
    q = _values(3 * block + 16, 64)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    assert torch.equal(packed.reshape(-1), _pack_as_documented(q, block))
