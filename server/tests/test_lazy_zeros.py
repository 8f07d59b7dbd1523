"""The CPU KV cache and decode mirror start zeroed but hold resident memory only for what is written."""

from __future__ import annotations

import gc
from pathlib import Path

import torch
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import LayerCache
from tandem_server.layers.attention.torch_decode_mirror import DecodeMirror, MirroredLayerCache, MirrorGeometry
from tandem_server.lazy_zeros import lazy_zeros

CPU = torch.device("cpu")
LARGE_BYTES = 512 << 20
# Far below LARGE_BYTES, far above what the bookkeeping of an allocation and one written block take.
RESIDENT_SLACK = 32 << 20


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def assert_zeroed_and_writable(tensor: torch.Tensor) -> None:
    assert torch.count_nonzero(tensor) == 0
    tensor[1].fill_(1.5)
    assert torch.equal(tensor[1], torch.full_like(tensor[1], 1.5))
    assert torch.count_nonzero(tensor[0]) == 0 and torch.count_nonzero(tensor[2:]) == 0


def test_a_large_cpu_kv_cache_is_zeroed_writable_and_not_resident_until_written() -> None:
    geometry = CacheGeometry(num_layers=4, block_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    num_blocks = LARGE_BYTES // geometry.bytes_per_block - 1
    gc.collect()
    before = resident_bytes()
    cache = KVCache(geometry, num_blocks, CPU)
    grown = resident_bytes() - before
    assert cache.nbytes == LARGE_BYTES
    assert grown < RESIDENT_SLACK, f"a {cache.nbytes >> 20} MiB cache made {grown >> 20} MiB resident"
    for layer in cache.layers:
        assert layer.key.dtype == torch.bfloat16 and layer.key.shape == (num_blocks + 1, 16, 8, 128)
        assert layer.key.is_contiguous() and layer.value.is_contiguous()
        assert layer.key.data_ptr() != layer.value.data_ptr()
        assert_zeroed_and_writable(layer.key)
        assert_zeroed_and_writable(layer.value)


def test_a_large_cpu_decode_mirror_is_zeroed_writable_and_not_resident_until_written() -> None:
    geometry = MirrorGeometry(num_layers=4, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    mirror = DecodeMirror(geometry, LARGE_BYTES, CPU)
    rows = 8
    gc.collect()
    before = resident_bytes()
    assert mirror.place([(request_id, LARGE_BYTES // mirror.bytes_per_position // rows) for request_id in range(rows)])
    grown = resident_bytes() - before
    assert mirror.nbytes == LARGE_BYTES
    assert grown < RESIDENT_SLACK, f"a {mirror.nbytes >> 20} MiB mirror made {grown >> 20} MiB resident"
    paged = LayerCache(torch.zeros(1), torch.zeros(1))
    for layer in mirror.attach([paged] * geometry.num_layers):
        assert isinstance(layer, MirroredLayerCache) and layer.mirror_key.shape == (rows, mirror.capacity, 8, 128)
        assert_zeroed_and_writable(layer.mirror_key)
        assert_zeroed_and_writable(layer.mirror_value)


def test_a_cache_whose_layers_differ_gives_each_layer_its_own_heads_in_cache_and_mirror() -> None:
    shapes = ((2, 16), (1, 32), (2, 16))
    geometry = CacheGeometry(3, 4, 2, 16, torch.float32, layer_shapes=shapes)
    assert geometry.bytes_per_token == 2 * (2 * 16 + 32 + 2 * 16) * 4
    cache = KVCache(geometry, 5, CPU)
    assert [tuple(layer.key.shape) for layer in cache.layers] == [(6, 4, *shape) for shape in shapes]
    assert [tuple(layer.value.shape) for layer in cache.layers] == [(6, 4, *shape) for shape in shapes]
    assert cache.nbytes == 6 * geometry.bytes_per_block
    mirror_geometry = MirrorGeometry.of(cache.layers)
    assert mirror_geometry.shapes == shapes
    mirror = DecodeMirror(mirror_geometry, 1 << 20, CPU)
    assert mirror.bytes_per_position == geometry.bytes_per_token
    assert mirror.place([(7, 3)])
    mirrored = mirror.attach(cache.layers)
    assert [tuple(layer.mirror_key.shape[2:]) for layer in mirrored] == list(shapes)  # type: ignore[attr-defined]


def test_a_cpu_tensor_keeps_its_memory_after_every_other_reference_is_gone() -> None:
    tensor = lazy_zeros((4, 1024), torch.float32, CPU)[2:]
    gc.collect()
    tensor.fill_(3.0)
    assert tensor.sum().item() == 3.0 * 2 * 1024


def test_empty_and_non_cpu_tensors_are_plain_zeros() -> None:
    assert lazy_zeros((0, 8), torch.float16, CPU).shape == (0, 8)
    meta = lazy_zeros((2, 3), torch.float16, torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 3) and meta.dtype == torch.float16
