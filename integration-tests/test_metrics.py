"""After a short load `/metrics` (router) and each shard's endpoint show the key series with sensible values."""

from __future__ import annotations

import time

from metrics_scrape import KEY_NAME, MAX_NEW_TOKENS, MetricsTandem, Scrape, scrape, send_mixed_load, total

COUNTER_LIKE = ("counter", "histogram")


def at_most(samples: Scrape, histogram: str, upper: float) -> float:
    """Observations of `histogram` no larger than `upper`: its bucket with that bound, summed over series."""
    buckets = samples.get(f"{histogram}_bucket", {})
    return sum(value for labels, value in buckets.items() if float(dict(labels)["le"]) == upper)


def scrape_once_steps_settle(url: str) -> tuple[Scrape, dict[str, str]]:
    """A scrape in which every answered step's scheduling time is recorded too: that time includes applying the
    answer, so it lands just after the step's last request has its response."""
    deadline = time.monotonic() + 10
    while True:
        samples, types = scrape(url)
        settled = total(samples, "tandem_step_scheduling_duration_seconds_count") == total(
            samples, "tandem_batch_size_count"
        )
        if settled or time.monotonic() > deadline:
            return samples, types
        time.sleep(0.05)


def test_router_metrics_count_every_request_token_and_failure(metrics_tandem: MetricsTandem) -> None:
    url = f"{metrics_tandem.server.base_url}/metrics"
    before, _ = scrape(url)
    completed = send_mixed_load(metrics_tandem)
    after, types = scrape_once_steps_settle(url)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("tandem_requests_total") == completed + 1
    assert delta("tandem_request_success_total") == completed
    assert delta("tandem_request_failure_total", reason="validation") == 1
    assert delta("tandem_time_to_first_token_seconds_count") == completed
    assert delta("tandem_request_duration_seconds_count") == completed
    # Sampled requests may stop at their first token (EOS), and such a request has no time per output token.
    single_token = at_most(after, "tandem_request_generated_tokens", 1) - at_most(
        before, "tandem_request_generated_tokens", 1
    )
    assert delta("tandem_time_per_output_token_seconds_count") == completed - single_token
    assert delta("tandem_request_queue_duration_seconds_count") == completed
    assert delta("tandem_request_prefill_duration_seconds_count") == completed
    generated = delta("tandem_generated_tokens_total")
    assert completed <= generated <= completed * MAX_NEW_TOKENS
    assert delta("tandem_request_generated_tokens_sum") == generated
    assert delta("tandem_inter_token_latency_seconds_count") == generated - completed
    assert delta("tandem_prompt_tokens_total") == delta("tandem_request_input_tokens_sum") > completed * 5
    assert delta("tandem_batch_size_count") > 0
    # Every request came with the one named key, so its series carry the totals.
    assert delta("tandem_key_requests_total", key=KEY_NAME) == completed + 1
    assert delta("tandem_key_prompt_tokens_total", key=KEY_NAME) == delta("tandem_prompt_tokens_total")
    assert delta("tandem_key_generated_tokens_total", key=KEY_NAME) == generated
    assert delta("tandem_key_queue_duration_seconds_count", key=KEY_NAME) == completed
    for part in ("forward", "prepare", "sampling", "shard", "scheduling"):
        assert delta(f"tandem_step_{part}_duration_seconds_count") == delta("tandem_batch_size_count"), part
    # The shard's whole handling of a step contains its forward pass; the round trip contains both.
    assert delta("tandem_step_forward_duration_seconds_sum") < delta("tandem_step_shard_duration_seconds_sum")
    assert delta("tandem_step_shard_duration_seconds_sum") < delta("tandem_step_duration_seconds_sum")
    assert 0 < delta("tandem_time_to_first_token_seconds_sum") < delta("tandem_request_duration_seconds_sum")
    assert total(after, "tandem_kv_blocks_total") > 0
    assert 0 <= total(after, "tandem_kv_cache_usage_ratio") <= 1
    assert 0 <= delta("tandem_prefix_cache_hits_tokens_total") <= delta("tandem_prefix_cache_queries_tokens_total")
    (info_labels,) = after["tandem_info"]
    info = dict(info_labels)
    assert (info["device"], info["num_shards"], info["block_size"]) == ("cpu", "1", "16")
    assert int(info["max_total_tokens"]) > 0
    for family, kind in types.items():
        if kind not in COUNTER_LIKE:
            continue
        for name, series in before.items():
            if name.startswith(family):
                for labels, value in series.items():
                    assert after[name][labels] >= value, (name, labels)


def test_shard_metrics_endpoint_reports_memory_kv_cache_and_forward_time(metrics_tandem: MetricsTandem) -> None:
    send_mixed_load(metrics_tandem)
    shard, _ = scrape(metrics_tandem.shard_metrics_url)
    assert total(shard, "tandem_shard_process_resident_memory_bytes") > 100 * 2**20
    assert total(shard, "tandem_shard_process_cpu_seconds_total") > 0
    assert total(shard, "tandem_shard_kv_cache_bytes", rank="0") > 0
    assert total(shard, "tandem_shard_forward_duration_seconds_count", phase="prefill") > 0
    assert total(shard, "tandem_shard_forward_duration_seconds_count", phase="decode") > 0
    assert "tandem_shard_device_memory_allocated_bytes" not in shard


# The Gateway API Inference Extension's endpoint picker scrapes these names by default (vLLM's).
MODEL_SERVER_PROTOCOL = {
    "vllm:num_requests_waiting": "tandem_queue_size",
    "vllm:num_requests_running": "tandem_running_requests",
    "vllm:kv_cache_usage_perc": "tandem_kv_cache_usage_ratio",
    "vllm:gpu_cache_usage_perc": "tandem_kv_cache_usage_ratio",
}


def test_router_metrics_follow_the_inference_extension_model_server_protocol(metrics_tandem: MetricsTandem) -> None:
    send_mixed_load(metrics_tandem)
    samples, types = scrape(f"{metrics_tandem.server.base_url}/metrics")
    for name, own_name in MODEL_SERVER_PROTOCOL.items():
        assert types[name] == "gauge", name
        ((labels, value),) = samples[name].items()
        assert labels == frozenset()
        assert value == total(samples, own_name), name
    assert 0 <= total(samples, "vllm:kv_cache_usage_perc") <= 1
    assert types["vllm:cache_config_info"] == "gauge"
    current = [dict(labels) for labels, value in samples["vllm:cache_config_info"].items() if value == 1]
    assert len(current) == 1
    assert current[0]["block_size"] == dict(next(iter(samples["tandem_info"])))["block_size"]
    assert int(current[0]["num_gpu_blocks"]) == total(samples, "tandem_kv_blocks_total") > 0
    # No LoRA adapters: the LoRA affinity series is absent, as the protocol allows.
    assert "vllm:lora_requests_info" not in types
