"""Graceful shutdown through the real launcher: SIGTERM drains in-flight streams and exits 0; a second
SIGTERM aborts at once; no process is left behind either way."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests
from tandem_harness import TandemServer, all_gone, model_cache_dir, sse_lines

FLAGS = ("--kv-cache-memory", "64MiB", "--max-input-tokens", "256", "--max-total-tokens", "512")
STREAMS = 8
# Greedy decoding continues this prompt well past 150 tokens (no early end-of-sequence).
PROMPT = "Once upon a time, in a faraway kingdom,"


def start(tmp_path: Path, *flags: str) -> TandemServer:
    return TandemServer.start(tmp_path / "launcher.log", "--model-cache-dir", str(model_cache_dir()), *FLAGS, *flags)


class Stream(threading.Thread):
    """One `/generate_stream` request read to its end on a thread."""

    def __init__(self, server: TandemServer, max_new_tokens: int) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.max_new_tokens = max_new_tokens
        self.started = threading.Event()
        self.events: list[dict] = []
        self.failure: Exception | None = None

    def run(self) -> None:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": self.max_new_tokens}}
        try:
            with requests.post(f"{self.server.base_url}/generate_stream", json=body, stream=True, timeout=300) as reply:
                for line in sse_lines(reply):
                    if line and line.startswith("data:"):
                        self.events.append(json.loads(line[len("data:") :]))
                        self.started.set()
        except requests.RequestException as error:
            self.failure = error
        finally:
            self.started.set()


def start_streams(server: TandemServer, count: int, max_new_tokens: int) -> list[Stream]:
    streams = [Stream(server, max_new_tokens) for _ in range(count)]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.started.wait(timeout=120)
    return streams


@pytest.mark.timeout(600)
def test_sigterm_drains_eight_streams_refuses_new_requests_and_exits_zero(tmp_path: Path) -> None:
    server = start(tmp_path, "--graceful-termination-timeout", "120")
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    streams = start_streams(server, STREAMS, max_new_tokens=40)
    signalled_at = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    refused = requests.post(f"{server.base_url}/generate", json={"inputs": "hi"}, timeout=10)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5", refused.text
    assert "shutting down" in refused.json()["error"]
    assert requests.get(f"{server.base_url}/ready", timeout=10).status_code == 503
    assert requests.get(f"{server.base_url}/health", timeout=10).json()["status"] == "draining"
    status = server.process.wait(timeout=150)
    print(f"\ndrain of {STREAMS} streams: launcher exited {time.monotonic() - signalled_at:.1f}s after SIGTERM")
    assert status == 0, server.log_tail()
    for stream in streams:
        stream.join(timeout=10)
        assert stream.failure is None, stream.failure
        assert stream.events[-1]["details"]["finish_reason"] == "length", stream.events[-1]
        assert len(stream.events) == 40
    assert all_gone(descendants)


@pytest.mark.timeout(600)
def test_a_second_sigterm_aborts_the_drain_at_once(tmp_path: Path) -> None:
    server = start(tmp_path, "--graceful-termination-timeout", "300")
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    (stream,) = start_streams(server, 1, max_new_tokens=400)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert server.process.poll() is None, "still draining the long stream"
    aborted_at = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        status = server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise
    assert status != 0
    assert time.monotonic() - aborted_at < 5.0
    assert "killing every child now" in server.log_path.read_text()
    deadline = time.monotonic() + 5
    while not all_gone(descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all_gone(descendants)
    stream.join(timeout=10)
