"""The model on CUDA in bfloat16, through every usable attention backend, against the float32 reference.

Skipped without a GPU; `make gpu-check` runs it on one. Tolerance: our bfloat16 logits may differ from the float32
transformers reference by twice as much as transformers itself in bfloat16 does (reference_checks.Target.bounds).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from draft_testing import BLOCK_SIZE as DRAFT_BLOCK_SIZE
from draft_testing import greedy_and_seeded_requests, oracle
from draft_testing import run as run_drafting
from reference_checks import BLOCK_SIZE, Target, assert_mixed_steps_match_logits
from shard_testing import CHECKPOINT_VARIANTS, StepDriver, load_tiny_model, new_request, step_graphs, write_tiny_llama
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import WarmupPlan
from tandem_server.layers.attention import create_backend
from tandem_server.layers.attention.selection import BACKEND_NAMES, AttentionNeeds, detect_packages, unusable_reason

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda", 0)


def usable_backends() -> list[str]:
    if not torch.cuda.is_available():
        return []
    needs = AttentionNeeds("cuda", torch.bfloat16, head_dim=16)
    packages = detect_packages("cuda")
    return [name for name in BACKEND_NAMES if unusable_reason(name, needs, packages) is None]


@pytest.mark.parametrize("backend", usable_backends())
@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_bf16_mixed_steps_match_float32_reference(tmp_path: Path, variant: str, backend: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    target = Target(CUDA, torch.bfloat16, create_backend(backend))
    assert_mixed_steps_match_logits(tmp_path, reference, f"{variant}/{backend}", target)


def cuda_runner(checkpoint: Path, backend: str, graph_sizes: tuple[int, ...], memory_fraction: float) -> ModelRunner:
    attention = create_backend(backend)
    model = load_tiny_model(checkpoint, CUDA, torch.bfloat16, attention)
    options = ExecutionOptions(cuda_memory_fraction=memory_fraction, cuda_graph_sizes=graph_sizes)
    return ModelRunner(model, (), torch.bfloat16, CUDA, options=options)


def test_warmup_sizes_the_cache_from_free_device_memory(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    runner = cuda_runner(tmp_path, "triton", (), memory_fraction=0.05)
    free_before, _ = torch.cuda.mem_get_info(CUDA)
    result = runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=256, max_batch_requests=16))
    # 5% of free memory, less the profiled step: far more than the 1-byte CPU budget would give.
    assert result.num_blocks > 1000
    assert result.kv_cache_bytes <= 0.05 * free_before


@pytest.mark.parametrize("backend", [name for name in usable_backends() if name == "triton"])
def test_graph_replayed_decode_generates_the_same_tokens_as_eager(tmp_path: Path, backend: str) -> None:
    write_tiny_llama(tmp_path)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 96) for _ in range(length)] for length in (9, 3, 14, 6, 5)]
    outputs = []
    for sizes in ((), (1, 2, 4, 8)):
        # A small cache keeps the driver's shuffled free-block list short.
        runner = cuda_runner(tmp_path, backend, sizes, memory_fraction=0.001)
        runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=8))
        assert (step_graphs(runner) is not None) == bool(sizes)
        driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=5, seed=3)
        outputs.append(driver.run([new_request(i, p, 12) for i, p in enumerate(prompts)]))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("backend", [name for name in usable_backends() if name in ("triton", "flash")])
def test_graph_replayed_verifying_steps_generate_the_same_tokens_as_eager(tmp_path: Path, backend: str) -> None:
    write_tiny_llama(tmp_path)
    requests = greedy_and_seeded_requests()
    prompts = {request.id: len(request.token_ids) for request in requests}
    plain = cuda_runner(tmp_path, backend, (), memory_fraction=0.001)
    plain.warmup(WarmupPlan(block_size=DRAFT_BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=4))
    reference = run_drafting(plain, requests, drafter=None)
    graphed = cuda_runner(tmp_path, backend, (1, 2, 4), memory_fraction=0.001)
    graphed.warmup(WarmupPlan(DRAFT_BLOCK_SIZE, 64, 4, max_drafts=4, max_drafting_requests=4))
    graphs = step_graphs(graphed)
    assert graphs is not None and any(shape.tokens_per_row == 5 for shape in graphs.shapes)
    drafted = run_drafting(graphed, requests, drafter=oracle(reference.tokens, prompts, wrong_every=2))
    assert drafted.tokens == reference.tokens
    assert 0 < drafted.accepted < drafted.drafted


def test_sampling_synchronises_with_the_host_exactly_once() -> None:
    import warnings  # noqa: PLC0415

    from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow  # noqa: PLC0415
    from tandem_server.sampling.statistics import TokenStatistics  # noqa: PLC0415

    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=3, repetition_penalty=1.2),
        SamplingParams(temperature=1.0, typical_p=0.9, frequency_penalty=0.5, logit_bias=((5, 2.0),)),
    ]
    rows = [
        SamplingRow(
            p,
            position=10 + i,
            statistics=TokenStatistics(p, (1, 2, 3, 4), 2, 500, CUDA),
            banned_ids=(7,),
            top_logprobs=i,
        )
        for i, p in enumerate(params)
    ]
    batch = SamplingBatch.build(rows, CUDA)
    logits = torch.randn(3, 500, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sampled = Sampler()(logits, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert len(sampled.token_ids) == 3 and len(sampled.top_logprobs[2]) == 2


def test_offloaded_blocks_come_back_bit_equal_and_their_saves_never_synchronise(tmp_path: Path) -> None:
    import warnings  # noqa: PLC0415

    from tandem_server.execution.kv_cache import CacheGeometry, KVCache  # noqa: PLC0415
    from tandem_server.execution.kv_offload import KvOffload, KvOffloadOptions, KvTransfer, Medium  # noqa: PLC0415

    geometry = CacheGeometry(num_layers=2, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)
    cache = KVCache(geometry, 32, CUDA)
    tensors = [tensor for layer in cache.layers for tensor in (layer.key, layer.value)]
    for tensor in tensors:
        tensor.normal_()
    saved = [tensor[3:7].clone() for tensor in tensors]
    block_bytes = geometry.bytes_per_block
    tiers = KvOffload([cache], KvOffloadOptions(4 * block_bytes, tmp_path, 4 * block_bytes))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tiers.run([KvTransfer(Medium.DEVICE, 3 + slot, Medium.HOST, slot) for slot in range(4)])
            # The step's forward overwrites the saved blocks on the compute stream right after.
            for tensor in tensors:
                tensor[3:7].zero_()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(warning.message) for warning in caught if "synchroniz" in str(warning.message)]
    assert not syncs, syncs
    # Through the disk tier and back into other blocks, in a later step.
    assert tiers.run([KvTransfer(Medium.HOST, 2, Medium.DISK, 0), KvTransfer(Medium.HOST, 3, Medium.DISK, 1)]) == ()
    assert tiers.run([KvTransfer(Medium.DISK, 0, Medium.HOST, 2), KvTransfer(Medium.DISK, 1, Medium.HOST, 3)]) == ()
    assert tiers.run([KvTransfer(Medium.HOST, slot, Medium.DEVICE, 20 + slot) for slot in range(4)]) == ()
    torch.cuda.synchronize()
    for tensor, expected in zip(tensors, saved, strict=True):
        assert torch.equal(tensor[20:24].view(torch.uint8), expected.view(torch.uint8))
