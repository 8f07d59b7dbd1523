"""The KV offload tiers' copies: blocks saved to host memory and disk come back bit-equal, and a torn or missing
disk entry is reported instead of being copied."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from tandem_server.errors import ConfigError
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.kv_offload import KvOffload, KvOffloadOptions, KvTransfer, Medium

DEVICE, HOST, DISK = Medium.DEVICE, Medium.HOST, Medium.DISK


def filled_cache(dtype: torch.dtype, num_blocks: int = 6) -> KVCache:
    geometry = CacheGeometry(num_layers=3, block_size=4, num_kv_heads=2, head_dim=8, dtype=dtype)
    cache = KVCache(geometry, num_blocks, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for layer in cache.layers:
        for tensor in (layer.key, layer.value):
            tensor.copy_(torch.randn(tensor.shape, generator=generator).to(dtype))
    return cache


def block(cache: KVCache, index: int) -> list[torch.Tensor]:
    return [tensor[index].clone() for layer in cache.layers for tensor in (layer.key, layer.value)]


def assert_blocks_equal(left: list[torch.Tensor], right: list[torch.Tensor]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def offload(cache: KVCache, host_blocks: int, tmp_path: Path | None = None, disk_blocks: int = 0) -> KvOffload:
    block_bytes = cache.geometry.bytes_per_block
    options = KvOffloadOptions(host_blocks * block_bytes, tmp_path, disk_blocks * block_bytes)
    return KvOffload([cache], options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_saved_to_host_memory_load_back_bit_equal_into_other_blocks(dtype: torch.dtype) -> None:
    cache = filled_cache(dtype)
    tiers = offload(cache, host_blocks=2)
    assert (tiers.host_slots, tiers.disk_slots, tiers.block_bytes) == (2, 0, cache.geometry.bytes_per_block)
    saved = [block(cache, 1), block(cache, 2)]
    assert tiers.run([KvTransfer(DEVICE, 1, HOST, 0), KvTransfer(DEVICE, 2, HOST, 1)]) == ()
    assert tiers.run([KvTransfer(HOST, 1, DEVICE, 4), KvTransfer(HOST, 0, DEVICE, 5)]) == ()
    assert_blocks_equal(block(cache, 4), saved[1])
    assert_blocks_equal(block(cache, 5), saved[0])


def test_copies_run_in_order_when_a_slot_is_reused_within_one_step() -> None:
    cache = filled_cache(torch.float32)
    tiers = offload(cache, host_blocks=1)
    second = block(cache, 2)
    # Slot 0 takes block 1, then block 2 (its first entry dropped), then goes to block 0.
    transfers = [KvTransfer(DEVICE, 1, HOST, 0), KvTransfer(DEVICE, 2, HOST, 0), KvTransfer(HOST, 0, DEVICE, 0)]
    assert tiers.run(transfers) == ()
    assert_blocks_equal(block(cache, 0), second)


def test_a_host_entry_moved_to_disk_reads_back_bit_equal(tmp_path: Path) -> None:
    cache = filled_cache(torch.bfloat16)
    tiers = offload(cache, host_blocks=1, tmp_path=tmp_path, disk_blocks=3)
    saved = block(cache, 3)
    steps = [
        [KvTransfer(DEVICE, 3, HOST, 0), KvTransfer(HOST, 0, DISK, 2), KvTransfer(DEVICE, 1, HOST, 0)],
        [KvTransfer(DISK, 2, HOST, 0), KvTransfer(HOST, 0, DEVICE, 5)],
    ]
    assert [tiers.run(step) for step in steps] == [(), ()]
    assert (tmp_path / "2.kv").is_file()
    assert_blocks_equal(block(cache, 5), saved)


def test_a_torn_or_missing_disk_entry_is_reported_and_never_copied(tmp_path: Path) -> None:
    cache = filled_cache(torch.float32)
    tiers = offload(cache, host_blocks=2, tmp_path=tmp_path, disk_blocks=2)
    tiers.run([KvTransfer(DEVICE, 1, HOST, 0), KvTransfer(HOST, 0, DISK, 0), KvTransfer(DEVICE, 2, HOST, 1)])
    entry = tmp_path / "0.kv"
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF
    entry.write_bytes(bytes(data))
    host_before = block(cache, 2)
    transfers = [KvTransfer(DISK, 0, HOST, 1), KvTransfer(DISK, 1, HOST, 1), KvTransfer(HOST, 1, DEVICE, 4)]
    assert tiers.run(transfers) == (0, 1), "the flipped byte fails its checksum; slot 1 was never written"
    assert_blocks_equal(block(cache, 4), host_before)
    entry.write_bytes(bytes(data[:10]))
    assert tiers.run([KvTransfer(DISK, 0, HOST, 1)]) == (0,)


def test_a_draft_models_cache_is_kept_beside_the_models() -> None:
    cache, draft = filled_cache(torch.float32), filled_cache(torch.float32)
    draft.layers[0].key.add_(1.0)
    block_bytes = cache.geometry.bytes_per_block + draft.geometry.bytes_per_block
    tiers = KvOffload([cache, draft], KvOffloadOptions(block_bytes))
    assert tiers.block_bytes == block_bytes and tiers.host_slots == 1
    saved = block(draft, 2)
    tiers.run([KvTransfer(DEVICE, 2, HOST, 0), KvTransfer(HOST, 0, DEVICE, 3)])
    assert_blocks_equal(block(draft, 3), saved)


def test_a_disk_tier_needs_a_host_tier() -> None:
    with pytest.raises(ConfigError, match="--kv-offload-memory"):
        KvOffloadOptions(host_bytes=0, disk_dir=Path("/tmp/unused"), disk_bytes=1 << 30)


def test_on_cuda_the_copies_run_on_a_side_stream_and_the_launch_never_waits_for_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCuda(free_bytes=2**30)
    fake.install(monkeypatch)
    geometry = CacheGeometry(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)

    def serve() -> tuple[list[list[str]], bool]:
        # On a worker thread bound to its device, as the model thread is: the fake places that thread's CUDA tensors
        # on the CPU.
        torch.cuda.set_device(0)
        cache = KVCache(geometry, 6, torch.device("cuda", 0))
        for layer in cache.layers:
            for tensor in (layer.key, layer.value):
                tensor.copy_(torch.randn(tensor.shape).to(tensor.dtype))
        block_bytes = geometry.bytes_per_block
        tiers = KvOffload([cache], KvOffloadOptions(3 * block_bytes, tmp_path, 2 * block_bytes))
        pinned = list(fake.registered.values())
        saved = [block(cache, 1), block(cache, 3)]
        steps = [
            [KvTransfer(DEVICE, 1, HOST, 0), KvTransfer(DEVICE, 3, HOST, 1)],
            # Slot 1's save from the step before lands before its disk write reads it.
            [KvTransfer(HOST, 1, DISK, 0), KvTransfer(HOST, 0, DEVICE, 4)],
            [KvTransfer(DISK, 0, HOST, 1), KvTransfer(HOST, 1, DEVICE, 5)],
            # A save and a load of the same slot in one step: the load reads what the save wrote.
            [KvTransfer(DEVICE, 4, HOST, 0), KvTransfer(HOST, 0, DEVICE, 2)],
        ]
        calls: list[list[str]] = []
        for step in steps:
            fake.calls.clear()
            assert tiers.run(step) == ()
            calls.append(fake.names())
        equal = all(
            torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for got, want in ((block(cache, 4), saved[0]), (block(cache, 5), saved[1]), (block(cache, 2), saved[0]))
            for a, b in zip(got, want, strict=True)
        )
        # A save still queued when the tiers close (a new Warmup) lands before the memory is unpinned.
        assert tiers.run([KvTransfer(DEVICE, 0, HOST, 2)]) == ()
        fake.calls.clear()
        tiers.close()
        closing = fake.names()
        return calls, equal, pinned, closing

    with ThreadPoolExecutor(max_workers=1) as worker:
        calls, equal, pinned, closing = worker.submit(serve).result()
    assert equal, "a block came back different"
    # Exactly the tier's 3 slots are pinned, not the next power of two, and nothing stays pinned after.
    assert pinned == [3 * geometry.bytes_per_block]
    assert not fake.registered
    assert closing == ["Event.synchronize", "cudaHostUnregister"], closing
    every_call = [name for names in calls for name in names]
    assert "async device copy" in every_call and "async host copy" in every_call
    assert not [name for name in every_call if name.startswith("blocking")], calls
    # The first two steps wait for no copy: the saves land later, found done by a query.
    assert not [name for names in calls[:2] for name in names if "synchronize" in name], calls[:2]
    # Step 0 saves two blocks of 2 layers' keys and values, step 1 loads one: 4 copies of the cache's bytes each,
    # all queued on the side stream. The one host copy outside it is the block numbers' index.
    assert _side_stream_copies(calls[0]) == (["async device copy"] * 4, ["async host copy"])
    assert _side_stream_copies(calls[1]) == (["async host copy"] * 4, ["async host copy"])


def _side_stream_copies(names: list[str]) -> tuple[list[str], list[str]]:
    """The copies a step queued inside a side stream's context (up to the event recorded after them), and outside."""
    inside: list[str] = []
    outside: list[str] = []
    on_side_stream = False
    for name in names:
        if name == "stream":
            on_side_stream = True
        elif name == "Event.record":
            on_side_stream = False
        elif name.startswith("async") and name.endswith("copy"):
            (inside if on_side_stream else outside).append(name)
    return inside, outside
