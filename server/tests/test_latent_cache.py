"""Multi-head latent attention's paged cache: one row of latent and rotary key per token and layer, sized so at
Warmup, served only by the attention backend that reads it, and read back by prefix-cache hits and recomputes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from shard_testing import CPU, StepDriver, load_tiny_model, make_runner, new_request, write_tiny_checkpoint
from tandem_server.config import CompileMode
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import ScheduledRequest, StepInput, WarmupPlan
from tandem_server.errors import ConfigError
from tandem_server.execution.chain import Execution
from tandem_server.execution.eager import EagerExecutor
from tandem_server.execution.kv_cache import CacheGeometry
from tandem_server.interfaces.attention_registry import FLASH_ATTN_4, TRITON
from tandem_server.layers.attention import SdpaAttentionBackend
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.attention.selection import (
    AttentionNeeds,
    ProbedPackages,
    needs_from_hf_config,
    select_backend,
)
from tandem_server.sampling import SamplingParams
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

KV_LORA_RANK = 16
QK_ROPE_HEAD_DIM = 8
NUM_LAYERS = 2
NUM_HEADS = 4
QK_NOPE_HEAD_DIM = 12
V_HEAD_DIM = 10
MLA = {
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_HEADS,
    "kv_lora_rank": KV_LORA_RANK,
    "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
    "qk_nope_head_dim": QK_NOPE_HEAD_DIM,
    "v_head_dim": V_HEAD_DIM,
    "q_lora_rank": 32,
    "n_routed_experts": 4,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "first_k_dense_replace": 1,
}


def write_mla(path: Path) -> None:
    write_tiny_checkpoint(path, DeepseekV3Config, DeepseekV3ForCausalLM, **MLA)


def test_kv_bytes_per_token_are_the_latent_and_rotary_key_of_each_layer(tmp_path: Path) -> None:
    write_mla(tmp_path)
    runner = make_runner(tmp_path)
    result = runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=64, max_batch_requests=8))
    element_size = torch.empty((), dtype=torch.float32).element_size()
    per_token = (KV_LORA_RANK + QK_ROPE_HEAD_DIM) * NUM_LAYERS * element_size
    cache = runner.cache
    assert cache is not None
    assert cache.geometry.bytes_per_token == per_token
    # What Warmup reports to the router: every block of the cache, the reserved one included.
    assert result.kv_cache_bytes == (result.num_blocks + 1) * cache.block_size * per_token
    # Per-head keys and values of the expanded form would take this many times as much.
    expanded = NUM_HEADS * (QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM + V_HEAD_DIM) * NUM_LAYERS * element_size
    assert expanded / per_token == pytest.approx(5.0)
    for layer in cache.layers:
        assert isinstance(layer, LatentLayerCache)
        assert tuple(layer.key.shape[1:]) == (cache.block_size, 1, KV_LORA_RANK + QK_ROPE_HEAD_DIM)
        assert layer.value.data_ptr() == layer.key.data_ptr()
        assert layer.value.shape[-1] == KV_LORA_RANK


def test_a_latent_block_is_sized_as_one_row_per_token_and_layer() -> None:
    # DeepSeek-V3's sizes: a 512-wide latent and a 64-wide rotary key.
    key_value = CacheGeometry(num_layers=3, block_size=16, num_kv_heads=1, head_dim=576, dtype=torch.bfloat16)
    latent = replace(key_value, latent_dim=512)
    assert latent.bytes_per_block == 3 * 16 * 576 * 2
    assert key_value.bytes_per_block == 2 * latent.bytes_per_block


def test_auto_takes_the_triton_backend_for_latent_attention_on_cuda() -> None:
    needs = AttentionNeeds("cuda", torch.bfloat16, head_dim=64, block_size=128, latent_attention=True)
    choice = select_backend("auto", needs, ProbedPackages({"flash": FLASH_ATTN_4, "triton": TRITON}))
    assert choice.name == "triton"
    assert "flash: flash-attn has no multi-head latent attention (MLA) path" in choice.describe()


def test_auto_takes_the_torch_backend_for_latent_attention_where_triton_is_missing() -> None:
    needs = AttentionNeeds("cuda", torch.bfloat16, head_dim=64, block_size=128, latent_attention=True)
    choice = select_backend("auto", needs, ProbedPackages({"flash": FLASH_ATTN_4, "triton": "no module named triton"}))
    assert choice.name == "torch"


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_a_backend_without_latent_attention_is_refused_by_name(backend: str) -> None:
    needs = AttentionNeeds("cuda", torch.bfloat16, head_dim=64, block_size=128, latent_attention=True)
    with pytest.raises(ConfigError, match=f"--attention-backend {backend} is unavailable: .*(MLA)"):
        select_backend(backend, needs, ProbedPackages({"flash": FLASH_ATTN_4, "triton": TRITON}))


def test_the_triton_backend_serves_latent_attention_when_named() -> None:
    needs = AttentionNeeds("cuda", torch.bfloat16, head_dim=64, block_size=16, latent_attention=True)
    assert select_backend("triton", needs, ProbedPackages({"triton": TRITON})).name == "triton"


def test_the_checkpoint_asks_for_latent_attention() -> None:
    hf = DeepseekV3Config(**MLA).to_dict()
    assert needs_from_hf_config(hf, "cpu", torch.float32).latent_attention
    assert not needs_from_hf_config({**hf, "kv_lora_rank": None}, "cpu", torch.float32).latent_attention


def test_a_latent_model_built_on_another_backend_is_a_start_up_error(tmp_path: Path) -> None:
    write_mla(tmp_path)
    with pytest.raises(ConfigError, match="the sdpa backend has no MLA kernel"):
        load_tiny_model(tmp_path, backend=SdpaAttentionBackend())


@pytest.mark.parametrize("mode", [CompileMode.WARMUP, CompileMode.BACKGROUND])
def test_latent_caches_run_every_step_eagerly_under_torch_compile(tmp_path: Path, mode: CompileMode) -> None:
    # The compiled decode graphs and the decode package attend through the decode mirror, which latent caches do
    # not keep: building them would compile graphs no step could run.
    write_mla(tmp_path)
    execution = Execution.build(load_tiny_model(tmp_path), CPU, mode)
    assert [type(executor) for executor in execution.executors] == [EagerExecutor]


PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 71, 23]
NEW_TOKENS = 6


def _greedy(runner: ModelRunner, request_id: int, blocks: tuple[int, ...], cached: int) -> list[int]:
    """Greedy tokens of PROMPT for a request whose first `cached` tokens' latents are in its blocks already."""
    request = new_request(request_id, PROMPT, max_new_tokens=NEW_TOKENS)
    step = StepInput(
        new_requests=(request,), scheduled=(ScheduledRequest(request_id, len(PROMPT) - cached, blocks, cached),)
    )
    tokens: list[int] = []
    while True:
        generation = runner.step(step).generations[0]
        tokens.append(generation.token_id)
        if generation.finish_reason is not None:
            return tokens
        step = StepInput(scheduled=(ScheduledRequest(request_id, 1, (), len(PROMPT) + len(tokens) - 1),))


def test_a_prefix_cache_hit_decodes_from_latents_another_request_wrote(tmp_path: Path) -> None:
    write_mla(tmp_path)
    runner = make_runner(tmp_path)
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    fresh = _greedy(runner, 1, (0, 1, 2, 3), cached=0)
    assert _greedy(runner, 2, (4, 5, 6, 7), cached=0) == fresh
    # Request 3 starts after the 8 tokens request 2 left in blocks 4 and 5, as the router's prefix cache hands them.
    assert _greedy(runner, 3, (4, 5, 8, 9), cached=8) == fresh


def test_a_preempted_request_recomputes_its_latents_and_resumes_with_the_same_tokens(tmp_path: Path) -> None:
    write_mla(tmp_path)
    runner = make_runner(tmp_path)
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    sampling = SamplingParams(temperature=1.0, top_k=20, seed=42)
    uninterrupted = StepDriver(runner, runner.cache.num_blocks, chunk_size=4).run(
        [new_request(1, PROMPT, max_new_tokens=8, sampling=sampling)]
    )[1]
    partial = StepDriver(runner, runner.cache.num_blocks, chunk_size=4, seed=1)
    partial.step([new_request(2, PROMPT, max_new_tokens=8, sampling=sampling)])
    while len(partial.tracked[2].generated) < 3:
        partial.step([])
    generated = partial.tracked.pop(2).generated
    runner.step(StepInput(finished=(2,)))
    recompute = new_request(3, PROMPT + generated, max_new_tokens=8, sampling=sampling, num_output_tokens=3)
    resumed = StepDriver(runner, runner.cache.num_blocks, chunk_size=16, seed=2).run([recompute])[3]
    assert generated + resumed == uninterrupted
