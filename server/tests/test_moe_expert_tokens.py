"""The MoE blocks' per-expert token counts: equal to the routing's choices over served steps, untouched by warm-up
and health probes, and rendered on the shard's metrics endpoint with bounded cardinality."""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest
from shard_testing import StepDriver, load_tiny_model, make_runner, new_request, warmed, write_tiny_checkpoint
from tandem_server.config import CompileMode
from tandem_server.expert_metrics import expert_series_fit, load_ratios
from tandem_server.layers.moe.expert_tokens import ExpertTokenCounters
from tandem_server.layers.moe.routing import Routing, TopKRouter
from tandem_server.metrics import ShardMetrics
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

# Three layers, the middle one dense: the sparse ones are decoder layers 0 and 2.
QWEN2_MOE = {
    "num_hidden_layers": 3,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "mlp_only_layers": [1],
}


def record_routing(monkeypatch: pytest.MonkeyPatch) -> dict[int, Counter[int]]:
    """Counts every expert choice each router makes, keyed by the router's identity."""
    chosen: dict[int, Counter[int]] = {}
    route = TopKRouter.route

    def recording(self: TopKRouter, hidden: torch.Tensor) -> Routing:
        routing = route(self, hidden)
        chosen.setdefault(id(self), Counter()).update(routing.experts.reshape(-1).tolist())
        return routing

    monkeypatch.setattr(TopKRouter, "route", recording)
    return chosen


def test_counts_equal_the_routings_choices_over_served_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    runner = warmed(make_runner(tmp_path))
    counters = runner.expert_tokens
    assert [sum(counts) for _, counts in counters.read()] == [0, 0]
    chosen = record_routing(monkeypatch)
    requests = [new_request(i, [5 + i, *range(20, 23 + 2 * i)], max_new_tokens=4 + i) for i in range(4)]
    StepDriver(runner, runner.cache.num_blocks, chunk_size=3).run(requests)
    routers = [layer.mlp.gate for layer in runner.model.model.layers if hasattr(layer.mlp, "gate")]
    expected = [[chosen[id(router)][expert] for expert in range(6)] for router in routers]
    assert counters.read() == [(0, expected[0]), (2, expected[1])]
    prompt_tokens, generated = sum(3 + 2 * i + 1 for i in range(4)), sum(4 + i for i in range(4))
    # Every prompt token and every generated token but each request's last went through each layer, twice (top-2).
    assert sum(expected[0]) == 2 * (prompt_tokens + generated - 4)


def test_warmup_and_health_probes_leave_the_counts_as_they_were(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    runner = warmed(make_runner(tmp_path))
    StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([new_request(0, [5, 6, 7], max_new_tokens=3)])
    served = runner.expert_tokens.read()
    runner.health_check()
    warmed(runner)
    assert runner.expert_tokens.read() == served
    assert sum(served[0][1]) == 2 * (3 + 2)


def test_a_served_models_counts_appear_on_the_shard_metrics_endpoint(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    runner = warmed(make_runner(tmp_path))
    StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([new_request(0, [5, 6, 7, 8], max_new_tokens=3)])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = ShardMetrics(rank=0, device=torch.device("cpu"))
    metrics.watch_expert_tokens(runner.expert_tokens.read)
    metrics.serve(port, "127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    (first, counts), (last, _) = runner.expert_tokens.read()
    assert (first, last) == (0, 2)
    for expert, count in enumerate(counts):
        assert f'tandem_shard_moe_expert_tokens_total{{expert="{expert}",layer="0",rank="0"}} {float(count)}' in text
    assert f'tandem_shard_moe_routed_tokens_total{{layer="2",rank="0"}} {2.0 * (4 + 2)}' in text


def test_a_dense_model_has_no_counters(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, LlamaConfig, LlamaForCausalLM)
    counters = ExpertTokenCounters(load_tiny_model(tmp_path))
    assert not counters
    assert counters.read() == []


def test_scrape_renders_per_layer_load_and_per_expert_counters() -> None:
    metrics = ShardMetrics(rank=0, device=torch.device("cpu"))
    metrics.watch_expert_tokens(lambda: [(0, [6, 2, 0, 0]), (3, [0, 0, 0, 0])])
    text = generate_latest(metrics.registry).decode()
    assert 'tandem_shard_moe_routed_tokens_total{layer="0",rank="0"} 8.0' in text
    assert 'tandem_shard_moe_routed_tokens_total{layer="3",rank="0"} 0.0' in text
    assert 'tandem_shard_moe_expert_load_max_ratio{layer="0",rank="0"} 3.0' in text
    assert 'tandem_shard_moe_expert_load_min_ratio{layer="0",rank="0"} 0.0' in text
    # A layer that routed nothing yet has no ratio rather than a division by zero.
    assert 'tandem_shard_moe_expert_load_max_ratio{layer="3"' not in text
    assert 'tandem_shard_moe_expert_tokens_total{expert="1",layer="0",rank="0"} 2.0' in text
    assert text.count("tandem_shard_moe_expert_tokens_total{") == 8


def test_per_expert_series_stop_beyond_the_cap_and_the_layer_summaries_stay() -> None:
    many = [(layer, [layer + 1] * 128) for layer in range(48)]
    assert not expert_series_fit(many)
    assert expert_series_fit([(layer, [1] * 8) for layer in range(32)])
    metrics = ShardMetrics(rank=1, device=torch.device("cpu"))
    metrics.watch_expert_tokens(lambda: many)
    text = generate_latest(metrics.registry).decode()
    assert "tandem_shard_moe_expert_tokens_total{" not in text
    assert 'tandem_shard_moe_routed_tokens_total{layer="47",rank="1"} 6144.0' in text
    assert 'tandem_shard_moe_expert_load_max_ratio{layer="47",rank="1"} 1.0' in text


def test_load_ratios_compare_the_extremes_with_an_even_split() -> None:
    assert load_ratios([3, 1]) == (1.5, 0.5)
    assert load_ratios([0, 0]) is None


@pytest.mark.slow
def test_compiled_decode_graphs_count_as_eager_steps_do(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    totals = []
    for mode in (CompileMode.OFF, CompileMode.WARMUP):
        runner = warmed(make_runner(tmp_path, compile_mode=mode))
        assert bool(runner.compilation().compiled_decode_rows) == (mode is CompileMode.WARMUP)
        requests = [new_request(i, [5 + i, 20, 21], max_new_tokens=5) for i in range(3)]
        StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run(requests)
        totals.append(runner.expert_tokens.read())
    assert totals[0] == totals[1]
    # 3 prompt tokens and 4 fed-back tokens per request, through each sparse layer, top-2.
    assert [sum(counts) for _, counts in totals[1]] == [2 * 3 * 7, 2 * 3 * 7]
