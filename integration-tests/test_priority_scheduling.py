"""`--scheduling-policy priority` through the real stack: with one request running at a time, a request that arrives
later with a more urgent `priority` runs before an earlier, less urgent one. A first-come server refuses priorities
other than 0 with a 400 naming the flag."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import requests
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama

# Long enough that the others queue behind it.
OCCUPYING_TOKENS = 300
# Long enough that whichever of the two queued requests runs second finishes many steps after the first, far beyond
# the jitter of the client threads that record when each answer arrived.
QUEUED_TOKENS = 64


@pytest.fixture(scope="module")
def by_priority(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    root = tmp_path_factory.mktemp("priority")
    write_tiny_llama(root / "model")
    server = TandemServer.start(
        root / "launcher.log",
        "--model-id", str(root / "model"), *FLOAT32_EAGER,
        "--kv-cache-memory", "16MiB",
        "--scheduling-policy", "priority",
        "--max-batch-size", "1",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def complete(server: TandemServer, priority: int, max_tokens: int) -> float:
    """Sends a completion; the monotonic time its answer arrived."""
    body = {"prompt": "The river", "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == max_tokens
    return time.monotonic()


def wait_until_running(server: TandemServer) -> None:
    deadline = time.monotonic() + 30
    while server.metric("tandem_running_requests") < 1:
        assert time.monotonic() < deadline, "the first request never ran"
        time.sleep(0.05)


def wait_until_queued(server: TandemServer, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.metric("tandem_queue_size") < count:
        assert time.monotonic() < deadline, f"{count} requests never queued"
        time.sleep(0.05)


def test_a_later_more_urgent_request_runs_before_an_earlier_less_urgent_one(by_priority: TandemServer) -> None:
    with ThreadPoolExecutor(3) as pool:
        occupying = pool.submit(complete, by_priority, 0, OCCUPYING_TOKENS)
        wait_until_running(by_priority)
        relaxed: Future[float] = pool.submit(complete, by_priority, 10, QUEUED_TOKENS)
        wait_until_queued(by_priority, 1)
        urgent: Future[float] = pool.submit(complete, by_priority, -5, QUEUED_TOKENS)
        wait_until_queued(by_priority, 2)
        occupying.result(timeout=300)
        assert urgent.result(timeout=120) < relaxed.result(timeout=120)


def test_a_first_come_server_refuses_a_priority_naming_the_policy(tandem: TandemServer) -> None:
    body = {"prompt": "The river", "max_tokens": 2, "priority": 3}
    refused = requests.post(f"{tandem.base_url}/v1/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    assert "--scheduling-policy priority" in refused.json()["error"]["message"]
    zero = requests.post(f"{tandem.base_url}/v1/completions", json={**body, "priority": 0}, timeout=60)
    assert zero.status_code == 200, zero.text


def test_priority_is_declared_in_the_openapi_document(by_priority: TandemServer) -> None:
    document = requests.get(f"{by_priority.base_url}/openapi.json", timeout=10).json()
    schemas = document["components"]["schemas"]
    assert "priority" in schemas["CompletionRequest"]["properties"]
    assert "priority" in schemas["ChatRequest"]["properties"]
