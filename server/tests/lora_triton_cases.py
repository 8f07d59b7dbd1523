"""Cases for test_lora_triton.py, run under TRITON_INTERPRET=1 (set before Triton is first imported): the BGMV
kernels against the torch product, and the engine's adapter steps through device slots against the merged
reference, with more adapters than slots."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from lora_testing import EVERYTHING, VALUES, AdapterSpec, greedy, merged, write_adapter
from shard_testing import CPU, StepDriver, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.lora import LoraLimits, LoraRegistry
from tandem_server.lora.slots import ROW_BLOCK, SEGMENTED_ROWS, RowBlocks
from tandem_server.lora.triton_bgmv import add_slotted_deltas
from tandem_server.lora.triton_sgmv import add_segmented_deltas
from triton_testing import widen_bfloat16_dots

widen_bfloat16_dots()

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# On a GPU (the GPU check runs this file without the interpreter) the kernels run on CUDA tensors; the engine's
# cases drive a CPU model, so they run only under the interpreter.
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
engine_under_the_interpreter = pytest.mark.skipif(ON_CUDA, reason="drives a CPU model through the kernels")

PROMPT = [5, 17, 33, 8, 61, 12, 40, 9]
NEW_TOKENS = 4
ADAPTERS = {
    "values": VALUES,
    "everything": EVERYTHING,
    "late": AdapterSpec(rank=4, alpha=12, targets=("q_proj", "gate_proj"), layers=(1,), seed=3),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_add_each_rows_slot_delta_and_leave_other_rows_alone(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    num_slots, rank, in_features, out_features, tokens = 3, 24, 70, 50, 9
    x = torch.randn(tokens, in_features, generator=generator).to(dtype)
    a = torch.randn(num_slots, rank, in_features, generator=generator).to(dtype)
    b = torch.randn(num_slots, out_features, rank, generator=generator).to(dtype)
    base = torch.randn(tokens, out_features, generator=generator).to(dtype)
    rows = torch.tensor([0, 2, 3, 7, 8])
    slots = torch.tensor([2, 0, 0, 1, 2])
    on = (base.clone(), x, a, b, rows, slots)
    out = add_slotted_deltas(*(tensor.to(DEVICE) for tensor in on)).cpu()
    expected = base.float().clone()
    for row, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        expected[row] += (x[row].float() @ a[slot].float().T) @ b[slot].float().T
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-1}
    torch.testing.assert_close(out.float(), expected, **tolerance)
    untouched = [row for row in range(tokens) if row not in rows.tolist()]
    assert torch.equal(out[untouched], base[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_segmented_kernels_add_each_rows_slot_delta_and_leave_other_rows_alone(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    num_slots, rank, in_features, out_features, tokens = 3, 40, 70, 90, 60
    x = torch.randn(tokens, in_features, generator=generator).to(dtype)
    a = torch.randn(num_slots, rank, in_features, generator=generator).to(dtype)
    b = torch.randn(num_slots, out_features, rank, generator=generator).to(dtype)
    base = torch.randn(tokens, out_features, generator=generator).to(dtype)
    # Segments of 21, 2 and 17 rows in no order: partial blocks, and a slot whose rows are not contiguous.
    rows = torch.randperm(tokens, generator=generator)[:40].sort().values
    slots = torch.tensor([0] * 21 + [2] * 2 + [1] * 17)[torch.randperm(40, generator=generator)]
    blocks = RowBlocks.of(rows.to(DEVICE), slots.to(DEVICE), DEVICE)
    assert blocks.block_slots.tolist() == [0, 0, 1, 1, 2] and ROW_BLOCK == 16
    on = (base.clone(), x, a, b)
    out = add_segmented_deltas(*(tensor.to(DEVICE) for tensor in on), blocks).cpu()
    expected = base.float().clone()
    for row, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        expected[row] += (x[row].float() @ a[slot].float().T) @ b[slot].float().T
    # bfloat16 rounds the shrunk rows to bfloat16 before the expand, as the model's own projections would.
    tolerance = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 1.0}
    torch.testing.assert_close(out.float(), expected, **tolerance)
    untouched = [row for row in range(tokens) if row not in rows.tolist()]
    assert torch.equal(out[untouched], base[untouched])


@engine_under_the_interpreter
def test_adapter_steps_through_two_device_slots_give_each_row_its_merged_reference(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    runner = warmed(make_runner(tmp_path / "model"))
    runner.lora = LoraRegistry(runner.model, LoraLimits(max_loras=2), torch.float32, CPU, device_slots=True)
    for name, spec in ADAPTERS.items():
        runner.lora.load(name, write_adapter(tmp_path / name, reference, spec))
    # Three adapters take turns in two slots: each pair of requests evicts the least recently used adapter.
    for first, second in (("values", "everything"), ("late", "values"), ("everything", "late")):
        driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=5)
        requests = [
            dataclasses.replace(new_request(1, PROMPT, max_new_tokens=NEW_TOKENS), lora_adapter=first),
            new_request(2, PROMPT[::-1], max_new_tokens=NEW_TOKENS),
            dataclasses.replace(new_request(3, PROMPT[2:], max_new_tokens=NEW_TOKENS), lora_adapter=second),
        ]
        driver.step(requests)
        while driver.tracked:
            driver.step([])
        assert driver.done[1] == greedy(merged(reference, tmp_path / first, ADAPTERS[first]), PROMPT, NEW_TOKENS)[0]
        assert driver.done[2] == greedy(reference, PROMPT[::-1], NEW_TOKENS)[0]
        third = merged(reference, tmp_path / second, ADAPTERS[second])
        assert driver.done[3] == greedy(third, PROMPT[2:], NEW_TOKENS)[0]


@engine_under_the_interpreter
def test_a_prompt_step_with_many_adapter_rows_runs_the_segmented_kernels_to_the_merged_reference(
    tmp_path: Path,
) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    runner = warmed(make_runner(tmp_path / "model"))
    runner.lora = LoraRegistry(runner.model, LoraLimits(max_loras=2), torch.float32, CPU, device_slots=True)
    for name in ("values", "everything"):
        runner.lora.load(name, write_adapter(tmp_path / name, reference, ADAPTERS[name]))
    prompts = {1: [*range(3, 37)], 2: [*range(40, 74)], 3: [*range(10, 44)]}
    adapters = {1: "values", 2: "", 3: "everything"}
    step = runner.lora.step([adapters[1], adapters[2], adapters[3]], [34, 34, 34], CPU)
    assert step is not None and 68 >= SEGMENTED_ROWS
    assert all(deltas.blocks is not None for _, deltas in step.changes)  # type: ignore[attr-defined]
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=64)
    requests = [
        dataclasses.replace(new_request(rid, prompt, max_new_tokens=NEW_TOKENS), lora_adapter=adapters[rid])
        for rid, prompt in prompts.items()
    ]
    driver.step(requests)
    while driver.tracked:
        driver.step([])
    for rid, prompt in prompts.items():
        name = adapters[rid]
        model = merged(reference, tmp_path / name, ADAPTERS[name]) if name else reference
        assert driver.done[rid] == greedy(model, prompt, NEW_TOKENS)[0]


def test_the_kernels_read_rows_of_a_transposed_input() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, 6, generator=generator).T
    a = torch.randn(2, 8, 40, generator=generator)
    b = torch.randn(2, 24, 8, generator=generator)
    rows, slots = torch.tensor([1, 4]), torch.tensor([1, 0])
    on = (torch.zeros(6, 24), x, a, b, rows, slots)
    out = add_slotted_deltas(*(tensor.to(DEVICE) for tensor in on)).cpu()
    expected = torch.zeros(6, 24)
    expected[1] = (x[1] @ a[1].T) @ b[1].T
    expected[4] = (x[4] @ a[0].T) @ b[0].T
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
