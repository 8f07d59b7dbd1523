"""The shard's metrics: phase classification of a step, recorded timings, the served endpoint, the flag."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest
from tandem_server.cli import config_from_args
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StoppingCriteria
from tandem_server.errors import ConfigError
from tandem_server.metrics import CompilationState, ShardMetrics
from tandem_server.sampling import SamplingParams


def scheduled(request_id: int, num_tokens: int) -> ScheduledRequest:
    return ScheduledRequest(id=request_id, num_tokens=num_tokens, new_block_ids=(), num_computed_tokens=0)


def new_request(request_id: int) -> NewRequest:
    return NewRequest(
        id=request_id,
        token_ids=(1,),
        num_output_tokens=0,
        sampling=SamplingParams(),
        stopping=StoppingCriteria(max_new_tokens=4),
    )


def test_steps_are_prefill_decode_or_mixed() -> None:
    decode = StepInput(scheduled=(scheduled(1, 1), scheduled(2, 1)))
    prefill = StepInput(new_requests=(new_request(3),), scheduled=(scheduled(3, 1),))
    mixed = StepInput(new_requests=(new_request(3),), scheduled=(scheduled(1, 1), scheduled(3, 7)))
    assert (decode.phase, prefill.phase, mixed.phase, StepInput().phase) == ("decode", "prefill", "mixed", None)


def test_step_timings_and_kv_size_render_with_the_rank_label() -> None:
    metrics = ShardMetrics(rank=1, device=torch.device("cpu"))
    metrics.kv_cache_allocated(4096)
    metrics.step_done(StepInput(scheduled=(scheduled(1, 1),)).phase, forward_ms=20.0, sampling_ms=5.0)
    metrics.step_done(StepInput().phase, forward_ms=0.0, sampling_ms=0.0)
    text = generate_latest(metrics.registry).decode()
    assert 'tandem_shard_kv_cache_bytes{rank="1"} 4096.0' in text
    assert 'tandem_shard_forward_duration_seconds_count{phase="decode",rank="1"} 1.0' in text
    assert 'tandem_shard_forward_duration_seconds_sum{phase="decode",rank="1"} 0.02' in text
    assert 'tandem_shard_forward_duration_seconds_count{phase="prefill",rank="1"} 0.0' in text
    assert 'tandem_shard_sampling_duration_seconds_count{rank="1"} 1.0' in text
    assert "tandem_shard_process_resident_memory_bytes" in text
    assert "tandem_shard_device_memory_allocated_bytes" not in text


def test_compiled_decode_rows_and_a_running_compile_are_read_at_each_scrape() -> None:
    metrics = ShardMetrics(rank=0, device=torch.device("cpu"))
    state = CompilationState((), compiling=True)
    metrics.watch_compilation(lambda: state)
    text = generate_latest(metrics.registry).decode()
    assert 'tandem_shard_compiling{rank="0"} 1.0' in text
    assert "tandem_shard_compiled_decode_rows{" not in text
    state = CompilationState((1, 2, 4), compiling=False)
    text = generate_latest(metrics.registry).decode()
    assert 'tandem_shard_compiling{rank="0"} 0.0' in text
    for rows in (1, 2, 4):
        assert f'tandem_shard_compiled_decode_rows{{rank="0",rows="{rows}"}} 1.0' in text


def test_metrics_endpoint_serves_the_registry_over_http() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = ShardMetrics(rank=0, device=torch.device("cpu"))
    metrics.kv_cache_allocated(123)
    metrics.serve(port, "127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert 'tandem_shard_kv_cache_bytes{rank="0"} 123.0' in response.read().decode()


def test_metrics_port_flag_defaults_off_and_rejects_out_of_range(tmp_path: Path) -> None:
    base = ["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s.sock")]
    assert config_from_args(base).metrics_port == 0
    assert config_from_args([*base, "--metrics-port", "9100"]).metrics_port == 9100
    with pytest.raises(ConfigError, match="--metrics-port"):
        config_from_args([*base, "--metrics-port", "70000"])
