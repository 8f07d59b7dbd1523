"""The CUDA path's host-side logic, checked on CPU: cache sizing, graph sizes and padding, rank devices, flags."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from tandem_server.bootstrap import choose_attention_backend, execution_options
from tandem_server.cli import config_from_args
from tandem_server.config import ShardConfig, parse_batch_sizes
from tandem_server.device_defaults import DEFAULT_CUDA_GRAPH_SIZES
from tandem_server.distributed import rank_device
from tandem_server.engine.timing import StepTimer
from tandem_server.engine.warmup import blocks_for_budget, cuda_cache_budget
from tandem_server.errors import CacheBudgetError, ConfigError
from tandem_server.execution.cuda_graphs import model_graph_shapes
from tandem_server.execution.kv_cache import CacheGeometry
from tandem_server.layers.attention import UniformShape
from tandem_server.layers.attention.latent_step import AbsorbedDecoding
from tandem_server.models.config import ModelSpec, read_checkpoint_config
from transformers import DeepseekV3Config

GIB = 1024**3
SHARD = ["--model-path", "m", "--uds-path", "s"]


def test_cuda_cache_budget_is_a_fraction_of_free_memory_less_the_profiled_step() -> None:
    # An H200 with an 8B bf16 model loaded: about 124 GiB free, a 512-token step peaking at 1.5 GiB.
    assert cuda_cache_budget(124 * GIB, 3 * GIB // 2, 0.9) == int(124 * GIB * 0.9) - 3 * GIB // 2
    # Llama-3-8B geometry: 32 layers x 8 kv heads x 128 dims, bf16, 16-token blocks = 2 MiB per block.
    geometry = CacheGeometry(32, 16, 8, 128, torch.bfloat16)
    assert geometry.bytes_per_block == 2 * 1024**2
    blocks = blocks_for_budget(
        geometry.bytes_per_block, cuda_cache_budget(124 * GIB, 3 * GIB // 2, 0.9), "--cuda-memory-fraction"
    )
    assert blocks == (int(124 * GIB * 0.9) - 3 * GIB // 2) // (2 * 1024**2) - 1


def test_captured_graphs_pool_is_set_aside_before_the_cache_is_sized() -> None:
    assert cuda_cache_budget(124 * GIB, GIB, 0.9, graph_bytes=GIB // 2) == int(124 * GIB * 0.9) - GIB - GIB // 2
    with pytest.raises(CacheBudgetError, match="capture fewer --cuda-graphs"):
        cuda_cache_budget(2 * GIB, GIB, 0.9, graph_bytes=GIB)


def test_no_memory_left_for_the_cache_names_the_flags_to_change() -> None:
    with pytest.raises(CacheBudgetError, match="raise --cuda-memory-fraction, lower --max-batch-prefill-tokens"):
        cuda_cache_budget(2 * GIB, 3 * GIB, 0.9)
    with pytest.raises(CacheBudgetError, match="raise --cuda-memory-fraction"):
        blocks_for_budget(
            CacheGeometry(32, 16, 8, 128, torch.bfloat16).bytes_per_block, 3 * 1024**2, "--cuda-memory-fraction"
        )


@pytest.mark.parametrize(("text", "expected"), [("0", ()), ("", ()), ("8, 1,4,4", (1, 4, 8))])
def test_cuda_graph_sizes_flag(text: str, expected: tuple[int, ...]) -> None:
    assert parse_batch_sizes(text, "--cuda-graphs") == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cuda-graphs", "1,two"], "--cuda-graphs must be comma-separated batch sizes"),
        (["--cuda-graphs", "0,4"], "--cuda-graphs batch sizes must be positive"),
        (["--cuda-graphs", "1,2"], "--cuda-graphs needs --device cuda"),
        (["--cuda-memory-fraction", "1.2"], "--cuda-memory-fraction must be in"),
        (["--attention-backend", "flashy"], "unknown attention backend 'flashy'"),
    ],
)
def test_bad_cuda_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*SHARD, *argv])


def test_shard_defaults_are_auto_backend_and_graphs_only_on_cuda() -> None:
    cpu = config_from_args(SHARD)
    assert (cpu.attention_backend, cpu.cuda_graph_sizes, cpu.cuda_memory_fraction) == ("auto", (), 0.9)
    cuda = config_from_args([*SHARD, "--device", "cuda", "--cuda-memory-fraction", "0.8"])
    assert (cuda.cuda_graph_sizes, cuda.cuda_memory_fraction) == (DEFAULT_CUDA_GRAPH_SIZES, 0.8)
    assert ShardConfig(model_path=cpu.model_path, uds_path=cpu.uds_path).attention_backend == "auto"


def test_each_rank_owns_the_gpu_of_its_number() -> None:
    assert rank_device(3, "cuda", 4) == torch.device("cuda", 3)
    assert rank_device(3, "cpu", 0) == torch.device("cpu")
    with pytest.raises(ConfigError, match="rank 2 needs cuda:2 but 2 CUDA device"):
        rank_device(2, "cuda", 2)


def test_cpu_step_timer_reports_one_duration_per_phase() -> None:
    timer = StepTimer(torch.device("cpu"))
    timer.mark()
    timer.mark()
    phases = timer.phases_ms()
    assert len(phases) == 2 and all(phase >= 0.0 for phase in phases)


LATENT_SPEC = ModelSpec(vocab_size=128, num_layers=2, num_kv_heads=1, head_dim=576, max_position_embeddings=64)


def test_a_latent_model_captures_decode_graphs_only_and_verifies_drafts_eagerly() -> None:
    latent = replace(LATENT_SPEC, latent_dim=512)
    per_head = replace(LATENT_SPEC, num_kv_heads=8, head_dim=128)
    decodes = (UniformShape(1, 1), UniformShape(4, 1), UniformShape(8, 1))
    assert model_graph_shapes(latent, (1, 4, 8), max_drafts=3, max_drafting_requests=4) == decodes
    verifying = model_graph_shapes(per_head, (1, 4, 8), max_drafts=3, max_drafting_requests=4)
    assert set(decodes) < set(verifying) and UniformShape(4, 4) in verifying


@pytest.mark.parametrize(
    ("requested", "chosen"), [("auto", "triton"), ("triton", "triton"), ("flash", None), ("sdpa", None)]
)
def test_a_deepseek_v3_shard_on_cuda_attends_through_the_triton_mla_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requested: str, chosen: str | None
) -> None:
    """On a (fake) H100 with Triton installed, `auto` and `triton` build the Triton backend, which serves latent
    attention; flash and sdpa stop start-up naming MLA."""
    FakeCuda(free_bytes=16 * GIB).install(monkeypatch)
    hf = {**DeepseekV3Config(num_hidden_layers=2).to_dict(), "architectures": ["DeepseekV3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    checkpoint = read_checkpoint_config(tmp_path)
    argv = [*SHARD, "--model-path", str(tmp_path), "--device", "cuda", "--attention-backend", requested]
    config = config_from_args(argv)
    if chosen is None:
        with pytest.raises(ConfigError, match=rf"--attention-backend {requested} is unavailable: .*\(MLA\)"):
            choose_attention_backend(config, checkpoint, decode_mirror_memory=0)
        return
    backend = choose_attention_backend(config, checkpoint, decode_mirror_memory=0)
    assert backend.name == chosen and isinstance(backend, AbsorbedDecoding)
    assert execution_options(config, backend).cuda_graph_sizes == config.cuda_graph_sizes != ()
