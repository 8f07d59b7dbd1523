"""`--scheduling-policy fair` through the real stack: with one request running at a time, a key that sends one
request after another key queued several is served next, not after the other key's queue. A key file line may carry
the key's weight. Under fair sharing a `priority` other than 0 is a 400 naming `--scheduling-policy priority`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import requests
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama

KEY_A = "sk-fair-tenant-a"
KEY_B = "sk-fair-tenant-b"
# Long enough that the others queue behind it.
OCCUPYING_TOKENS = 300
# Long enough that each queued request finishes many steps after the one served before it, far beyond the jitter of
# the client threads that record when each answer arrived.
QUEUED_TOKENS = 64
QUEUED_FROM_A = 3
WAIT_S = 30.0


@pytest.fixture(scope="module")
def fair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    root = tmp_path_factory.mktemp("fair")
    write_tiny_llama(root / "model")
    key_file = root / "keys.txt"
    key_file.write_text(f"# two tenants\n{KEY_A}\n{KEY_B} weight=1 name=tenant-b\n")
    server = TandemServer.start(
        root / "launcher.log",
        "--model-id", str(root / "model"), *FLOAT32_EAGER,
        "--kv-cache-memory", "16MiB",
        "--api-key-file", str(key_file),
        "--scheduling-policy", "fair",
        "--max-batch-size", "1",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def complete(server: TandemServer, key: str, max_tokens: int) -> float:
    """Sends a completion with `key`; the monotonic time its answer arrived."""
    body = {"prompt": "The river", "max_tokens": max_tokens, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == max_tokens
    return time.monotonic()


def test_a_keys_later_request_runs_before_another_keys_queued_requests(fair: TandemServer) -> None:
    with ThreadPoolExecutor(2 + QUEUED_FROM_A) as pool:
        occupying = pool.submit(complete, fair, KEY_A, OCCUPYING_TOKENS)
        assert fair.wait_for_metric("tandem_running_requests", 1, WAIT_S) == 1, "the first request never ran"
        queued_from_a: list[Future[float]] = []
        for count in range(1, QUEUED_FROM_A + 1):
            queued_from_a.append(pool.submit(complete, fair, KEY_A, QUEUED_TOKENS))
            assert fair.wait_for_metric("tandem_queue_size", count, WAIT_S) == count
        from_b = pool.submit(complete, fair, KEY_B, QUEUED_TOKENS)
        assert fair.wait_for_metric("tandem_queue_size", QUEUED_FROM_A + 1, WAIT_S) == QUEUED_FROM_A + 1
        assert fair.metric("tandem_scheduling_tenants") == 2
        occupying.result(timeout=300)
        b_done = from_b.result(timeout=120)
        assert all(b_done < queued.result(timeout=120) for queued in queued_from_a)


def test_metrics_count_tenants_and_each_keys_requests_by_name_without_naming_keys(fair: TandemServer) -> None:
    def per_key(name: str, key: str) -> float:
        return fair.metric(name, key=key)

    before = {
        (name, key): per_key(name, key)
        for name in ("tandem_key_requests_total", "tandem_key_generated_tokens_total")
        for key in ("tenant-b", "unnamed")
    }
    complete(fair, KEY_B, 4)
    complete(fair, KEY_A, 3)
    assert per_key("tandem_key_requests_total", "tenant-b") == before["tandem_key_requests_total", "tenant-b"] + 1
    assert per_key("tandem_key_requests_total", "unnamed") == before["tandem_key_requests_total", "unnamed"] + 1
    generated_b = per_key("tandem_key_generated_tokens_total", "tenant-b")
    assert generated_b == before["tandem_key_generated_tokens_total", "tenant-b"] + 4
    generated_a = per_key("tandem_key_generated_tokens_total", "unnamed")
    assert generated_a == before["tandem_key_generated_tokens_total", "unnamed"] + 3
    assert per_key("tandem_key_queue_duration_seconds_count", "tenant-b") >= 1
    text = requests.get(f"{fair.base_url}/metrics", timeout=10).text
    assert "tandem_scheduling_tenants" in text
    assert KEY_A not in text
    assert KEY_B not in text


def test_a_fair_server_refuses_a_priority_naming_the_priority_policy(fair: TandemServer) -> None:
    body = {"prompt": "The river", "max_tokens": 2, "priority": 3}
    headers = {"Authorization": f"Bearer {KEY_B}"}
    refused = requests.post(f"{fair.base_url}/v1/completions", json=body, headers=headers, timeout=30)
    assert refused.status_code == 400, refused.text
    assert "--scheduling-policy priority" in refused.json()["error"]["message"]
    zero = requests.post(f"{fair.base_url}/v1/completions", json={**body, "priority": 0}, headers=headers, timeout=60)
    assert zero.status_code == 200, zero.text
