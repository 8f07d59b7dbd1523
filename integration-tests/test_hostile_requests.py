"""Hostile but well-formed requests through the real stack: every per-request bound answers a clear 4xx, floods of
deep health probes and of large `/tokenize` calls stay cheap, slow and idle connections are closed, and a greedy
stream running beside all of it finishes with exactly the tokens it produces alone."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from tandem_harness import TandemServer, model_cache_dir

VOCAB_SIZE = 49152
HEADER_READ_TIMEOUT_S = 2
LIMITS = {
    "max_stop_sequence_length": 16,
    "max_stop_token_ids": 4,
    "max_logit_bias": 8,
    "max_tools": 2,
    "max_grammar_bytes": 2048,
    "max_choices": 4,
    "max_connections": 256,
    "header_read_timeout_s": HEADER_READ_TIMEOUT_S,
}
PROMPT = "Once upon a time, in a faraway kingdom,"
STREAM_TOKENS = 48
ONE_GIB = 1024**3


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    """A server with small limits, so each bound is reached with small requests."""
    flags = []
    for name, value in LIMITS.items():
        flags += [f"--{name.removesuffix('_s').replace('_', '-')}", str(value)]
    server = TandemServer.start(
        tmp_path_factory.mktemp("hostile") / "launcher.log",
        "--model-cache-dir", str(model_cache_dir()),
        "--kv-cache-memory", "128MiB",
        "--max-input-tokens", "256",
        "--max-total-tokens", "512",
        "--max-concurrent-requests", "16",
        *flags,
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


class GreedyStream(threading.Thread):
    """`/generate_stream` of PROMPT read to its end on a thread; its token ids."""

    def __init__(self, server: TandemServer) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.ids: list[int] = []
        self.failure: Exception | None = None

    def run(self) -> None:
        try:
            self.ids = self.server.stream_ids(PROMPT, STREAM_TOKENS)
        except (requests.RequestException, AssertionError) as error:
            self.failure = error

    def finish(self) -> list[int]:
        self.join(timeout=300)
        assert self.failure is None, self.failure
        return self.ids


@pytest.fixture(scope="module")
def alone(guarded: TandemServer) -> list[int]:
    ids = guarded.stream_ids(PROMPT, STREAM_TOKENS)
    assert len(ids) == STREAM_TOKENS
    return ids


def test_the_limits_are_the_flags_the_launcher_was_given(guarded: TandemServer) -> None:
    info = guarded.info()
    assert {name: info[name] for name in LIMITS} == LIMITS


def _tools(count: int) -> list[dict[str, object]]:
    function = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    return [{"type": "function", "function": {**function, "name": f"f{i}"}} for i in range(count)]


def _large_schema() -> dict[str, object]:
    properties = {f"field_{i}": {"type": "string", "description": "x" * 40} for i in range(60)}
    schema = {"type": "object", "properties": properties}
    return {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}


CHAT = [{"role": "user", "content": "hi"}]
# (route, body, the parameter the error names)
OVER_THE_BOUNDS = [
    ("/v1/completions", {"prompt": "a", "stop": ["s" * 17]}, "stop"),
    ("/generate", {"inputs": "a", "parameters": {"stop": ["s" * 17]}}, "stop"),
    ("/v1/completions", {"prompt": "a", "stop_token_ids": [1, 2, 3, 4, 5]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {str(i): 1 for i in range(9)}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": _tools(3)}, "tools"),
    (
        "/v1/chat/completions",
        {"messages": CHAT, "response_format": _large_schema()},
        "response_format.json_schema.schema",
    ),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 3}, "n"),
    ("/v1/completions", {"prompt": list(range(300)), "echo": True, "max_tokens": 1}, None),
    ("/v1/completions", {"prompt": [1, VOCAB_SIZE]}, "prompt"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {str(VOCAB_SIZE): 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "a", "stop_token_ids": [VOCAB_SIZE]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "a", "min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ("/v1/completions", {"prompt": list(range(250)), "min_tokens": 300}, "min_tokens"),
]


def _error_param(route: str, reply: requests.Response) -> str | None:
    body = reply.json()
    if route.startswith("/v1/"):
        assert reply.status_code == 400, body
        return body["error"]["param"]
    assert reply.status_code == 422, body
    return next((p for p in ("stop", "stop_token_ids") if f"`{p}`" in body["error"]), None)


def test_each_bound_is_a_clear_4xx_and_a_concurrent_stream_is_unchanged(
    guarded: TandemServer, alone: list[int]
) -> None:
    stream = GreedyStream(guarded)
    stream.start()
    for route, body, param in OVER_THE_BOUNDS:
        reply = requests.post(f"{guarded.base_url}{route}", json=body, timeout=60)
        assert _error_param(route, reply) == param, (route, body, reply.text)
    assert stream.finish() == alone


def test_requests_at_the_bounds_are_served(guarded: TandemServer) -> None:
    body = {
        "prompt": ["a", "b"],
        "n": 2,
        "max_tokens": 2,
        "stop": ["s" * 16],
        "stop_token_ids": [1, 2, 3, VOCAB_SIZE - 1],
        "logit_bias": {str(i): -1 for i in range(8)},
    }
    reply = requests.post(f"{guarded.base_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"]) == 4


def test_a_non_json_content_type_is_refused_with_415(guarded: TandemServer) -> None:
    body = json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 1}})
    form = requests.post(f"{guarded.base_url}/generate", data=body, timeout=30)
    assert form.status_code == 415, form.text
    assert "Content-Type" in form.json()["error"]
    typed = requests.post(
        f"{guarded.base_url}/generate", data=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert typed.status_code == 200, typed.text


def test_a_deep_health_flood_runs_at_most_one_probe_per_interval(guarded: TandemServer, alone: list[int]) -> None:
    before = guarded.metric("tandem_health_deep_probes_total")
    stream = GreedyStream(guarded)
    stream.start()
    started = time.monotonic()
    url = f"{guarded.base_url}/health?deep=true"
    with ThreadPoolExecutor(max_workers=200) as pool:
        replies = list(pool.map(lambda _: requests.get(url, timeout=120).status_code, range(200)))
    elapsed = time.monotonic() - started
    assert replies == [200] * 200
    probes = guarded.metric("tandem_health_deep_probes_total") - before
    assert 1 <= probes <= elapsed + 2, (probes, elapsed)
    assert stream.finish() == alone


def _router(server: TandemServer) -> psutil.Process:
    for child in psutil.Process(server.process.pid).children(recursive=True):
        if "tandem-router" in " ".join(child.cmdline()):
            return child
    raise AssertionError("no router process")


def test_a_tokenize_flood_goes_through_admission_in_bounded_memory(guarded: TandemServer) -> None:
    router = _router(guarded)
    text = ("the quick brown fox jumps over the lazy dog " * 45_000)[:1_990_000]
    peak = router.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, router.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(max_workers=24) as pool:
        statuses = list(
            pool.map(
                lambda _: requests.post(f"{guarded.base_url}/tokenize", json={"inputs": text}, timeout=300).status_code,
                range(24),
            )
        )
    done.set()
    sampler.join()
    assert set(statuses) <= {200, 429} and 200 in statuses, statuses
    assert peak < ONE_GIB, f"router RSS peaked at {peak / 2**20:.0f} MiB"
    tokens = requests.post(f"{guarded.base_url}/tokenize", json={"inputs": "Hello world"}, timeout=30).json()
    assert "".join(token["text"] for token in tokens) == "Hello world"


def _closed_within(client: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes `client` (reading and discarding what it sends first)."""
    started = time.monotonic()
    client.settimeout(limit_s)
    while client.recv(4096):
        pass
    return time.monotonic() - started


def test_slow_header_and_idle_clients_are_disconnected(guarded: TandemServer) -> None:
    host, port = guarded.base_url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    slow = socket.create_connection((host, int(port)))
    slow.sendall(b"POST /generate HTTP/1.1\r\nHost: tandem\r\n")
    idle = socket.create_connection((host, int(port)))
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: tandem\r\n\r\n")
    assert idle.recv(4096).startswith(b"HTTP/1.1 200")
    for client in (silent, slow, idle):
        with client:
            waited = _closed_within(client, HEADER_READ_TIMEOUT_S * 4)
            assert waited < HEADER_READ_TIMEOUT_S * 3
    assert requests.get(f"{guarded.base_url}/health", timeout=10).status_code == 200
