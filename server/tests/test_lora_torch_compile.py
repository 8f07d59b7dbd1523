"""LoRA adapters beside --torch-compile warmup: the layers' compiled stages never run a step's adapter rows without
their deltas (the stages' guards see the swapped weight format), and base decodes keep their compiled graphs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lora_testing import AdapterSpec, greedy, merged, write_adapter
from shard_testing import StepDriver, decode_graph, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.config import CompileMode

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 33, 8, 61, 12, 40, 9]
NEW_TOKENS = 4
SPEC = AdapterSpec(rank=8, alpha=16, targets=("q_proj", "v_proj", "o_proj", "down_proj"), seed=7)


@pytest.fixture(autouse=True)
def fresh_compiler() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_adapter_rows_give_the_merged_reference_while_base_decodes_keep_their_compiled_graphs(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    runner = warmed(make_runner(tmp_path / "model", compile_mode=CompileMode.WARMUP))
    runner.lora.load("adapter", write_adapter(tmp_path / "adapter", reference, SPEC))
    graph = decode_graph(runner)
    assert graph is not None
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=16)
    adapted = dataclasses.replace(new_request(1, PROMPT, max_new_tokens=NEW_TOKENS), lora_adapter="adapter")
    driver.step([adapted, new_request(2, PROMPT[::-1], max_new_tokens=NEW_TOKENS)])
    while driver.tracked:
        driver.step([])
    assert driver.done[1] == greedy(merged(reference, tmp_path / "adapter", SPEC), PROMPT, NEW_TOKENS)[0]
    assert driver.done[2] == greedy(reference, PROMPT[::-1], NEW_TOKENS)[0]
    decoded = graph.steps
    driver.run([new_request(3, PROMPT, max_new_tokens=NEW_TOKENS)])
    assert driver.done[3] == greedy(reference, PROMPT, NEW_TOKENS)[0]
    assert graph.steps > decoded
