"""Crash recovery through the real launcher: a shard killed with SIGKILL mid-stream fails only the
running request, the group restarts, the router keeps its port, and no process is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests
from tandem_harness import TandemServer, all_gone, model_cache_dir

FLAGS = ("--kv-cache-memory", "64MiB", "--max-input-tokens", "256", "--max-total-tokens", "512")
RECOVERY_TIMEOUT_S = 240.0


def start(tmp_path: Path, *flags: str) -> TandemServer:
    return TandemServer.start(tmp_path / "launcher.log", "--model-cache-dir", str(model_cache_dir()), *FLAGS, *flags)


def shard_processes(server: TandemServer) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(server.process.pid).children(recursive=True)
        if any("tandem-shard" in part for part in child.cmdline())
    ]


def stream_events(server: TandemServer, max_new_tokens: int):
    """The `data:` payloads of a `/generate_stream` call, as they arrive."""
    body = {"inputs": "Once upon a time, in a faraway kingdom,", "parameters": {"max_new_tokens": max_new_tokens}}
    with requests.post(f"{server.base_url}/generate_stream", json=body, stream=True, timeout=60) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                yield json.loads(line[len("data:") :])


def first_success_after(server: TandemServer, started: float) -> tuple[float, list[requests.Response]]:
    """Seconds from `started` until `/generate` succeeds again, and the refusals seen meanwhile."""
    refusals = []
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 5}}
    while time.monotonic() - started < RECOVERY_TIMEOUT_S:
        response = requests.post(f"{server.base_url}/generate", json=body, timeout=120)
        if response.status_code == 200:
            return time.monotonic() - started, refusals
        refusals.append(response)
        time.sleep(0.2)
    raise AssertionError(f"no successful request {RECOVERY_TIMEOUT_S:g}s after the kill:\n{server.log_tail()}")


@pytest.mark.timeout(600)
def test_a_shard_killed_mid_stream_fails_that_stream_then_the_group_restarts(tmp_path: Path) -> None:
    server = start(tmp_path)
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    try:
        (shard,) = shard_processes(server)
        events = stream_events(server, max_new_tokens=400)
        for _ in range(3):
            assert "token" in next(events)
        os.kill(shard.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        rest = list(events)  # must end: no hang
        assert rest and "error" in rest[-1], rest[-3:]
        assert rest[-1]["error_type"] == "generation" and "shard" in rest[-1]["error"]
        recovery_s, refusals = first_success_after(server, killed_at)
        print(f"\nrecovery after SIGKILL of a shard: {recovery_s:.1f}s to the first successful request")
        for refusal in refusals:
            assert refusal.status_code == 503, refusal.text
            assert refusal.headers["Retry-After"] == "5"
            assert refusal.json()["error_type"] == "unhealthy"
        assert requests.get(f"{server.base_url}/ready", timeout=10).status_code == 200
        assert requests.get(f"{server.base_url}/health", timeout=10).json()["status"] == "ok"
        log = server.log_path.read_text()
        assert "restarting all 1 shard(s) in 1s (restart 1 of at most 3" in log
        assert "recovered: the shards are warmed up again" in log
        (new_shard,) = shard_processes(server)
        assert new_shard.pid != shard.pid
        descendants += psutil.Process(server.process.pid).children(recursive=True)
    finally:
        status = server.stop()
    assert status == 0, server.log_tail()
    assert all_gone(descendants)


@pytest.mark.timeout(600)
def test_without_a_restart_budget_a_killed_shard_ends_the_launcher_non_zero(tmp_path: Path) -> None:
    server = start(tmp_path, "--max-restarts", "0")
    # The router answers /health a moment before the launcher finishes start-up; a shard lost before then is a
    # start-up failure, not a crash the restart budget applies to.
    deadline = time.monotonic() + 60
    while "Tandem is ready at" not in server.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    (shard,) = shard_processes(server)
    os.kill(shard.pid, signal.SIGKILL)
    try:
        status = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise
    assert status != 0
    assert "giving up: 0 restart(s) within 600s already used (--max-restarts)" in server.log_path.read_text()
    deadline = time.monotonic() + 10
    while not all_gone(descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all_gone(descendants)
