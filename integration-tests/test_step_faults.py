"""An injected step error (`--fault-inject-step-error`): every request in flight fails with a clear error in its API's
shape, the shard group recovers (a single shard is reset in place; a tensor-parallel group is restarted by the
launcher), later requests succeed with the same greedy output as before the fault, and no prompt or output text
reaches the logs."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from tandem_harness import TandemServer, model_cache_dir, sse_lines

# The probe before the fault takes FAULT_STEP - IN_FLIGHT_MARGIN steps at most, so the fault lands while the
# in-flight requests (admitted together, each generating far more tokens than the margin) are all decoding.
PROBE_TOKENS = 8
IN_FLIGHT_MARGIN = 30
FAULT_STEP = PROBE_TOKENS + IN_FLIGHT_MARGIN
IN_FLIGHT_TOKENS = 200
RECOVERY_TIMEOUT_S = 240.0
FLAGS = ("--kv-cache-memory", "64MiB", "--max-input-tokens", "256", "--max-total-tokens", "512")
PROBE_PROMPT = "Quokka-7391 asked the lighthouse keeper about the tide tables"


def native_stream(base_url: str) -> list[dict[str, Any]]:
    body = {"inputs": "Once upon a time, in a faraway kingdom,", "parameters": {"max_new_tokens": IN_FLIGHT_TOKENS}}
    with requests.post(f"{base_url}/generate_stream", json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        return [json.loads(line[5:]) for line in sse_lines(response) if line.startswith("data:")]


def openai_stream(base_url: str) -> list[str]:
    body = {
        "model": "tandem",
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": IN_FLIGHT_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        return [line[5:].strip() for line in sse_lines(response) if line.startswith("data:")]


def native_generate(base_url: str) -> requests.Response:
    body = {"inputs": "Once upon a time, a printing press", "parameters": {"max_new_tokens": IN_FLIGHT_TOKENS}}
    return requests.post(f"{base_url}/generate", json=body, timeout=120)


def openai_completion(base_url: str) -> requests.Response:
    body = {"model": "tandem", "prompt": "A recipe for bread:", "max_tokens": IN_FLIGHT_TOKENS, "ignore_eos": True}
    return requests.post(f"{base_url}/v1/completions", json=body, timeout=120)


def probe(base_url: str) -> requests.Response:
    """The greedy request compared before and after the fault."""
    body = {"inputs": PROBE_PROMPT, "parameters": {"max_new_tokens": PROBE_TOKENS, "details": True}}
    return requests.post(f"{base_url}/generate", json=body, timeout=120)


def first_success_after(server: TandemServer, started: float) -> tuple[float, dict[str, Any]]:
    """Seconds from `started` until the probe succeeds again, and its answer; refusals meanwhile are 503s."""
    while time.monotonic() - started < RECOVERY_TIMEOUT_S:
        response = probe(server.base_url)
        if response.status_code == 200:
            return time.monotonic() - started, response.json()
        assert response.status_code == 503 and response.json()["error_type"] == "unhealthy", response.text
        time.sleep(0.1)
    raise AssertionError(f"no successful request {RECOVERY_TIMEOUT_S:g}s after the fault:\n{server.log_tail()}")


def assert_failed_in_flight(results: dict[str, Any]) -> None:
    """Each in-flight request ended with a generation error in its API's shape, naming the shard failure."""
    native_events = results["native_stream"]
    assert "token" in native_events[0] and "error" in native_events[-1], native_events[-2:]
    assert native_events[-1]["error_type"] == "generation" and "injected fault" in native_events[-1]["error"]

    openai_events = results["openai_stream"]
    assert openai_events[-1] == "[DONE]", openai_events[-3:]
    error = json.loads(openai_events[-2])["error"]
    assert error["type"] == "server_error" and "injected fault" in error["message"]

    native = results["native_generate"]
    assert native.status_code == 424, native.text
    assert native.json()["error_type"] == "generation" and "injected fault" in native.json()["error"]

    completion = results["openai_completion"]
    assert completion.status_code == 500, completion.text
    assert completion.json()["error"]["type"] == "server_error"
    assert "injected fault" in completion.json()["error"]["message"]


@pytest.mark.timeout(600)
def test_an_injected_step_error_fails_the_requests_in_flight_and_the_group_recovers(tmp_path: Path) -> None:
    flags = (*FLAGS, "--fault-inject-step-error", f"0:{FAULT_STEP}")
    server = TandemServer.start(tmp_path / "launcher.log", "--model-cache-dir", str(model_cache_dir()), *flags)
    try:
        before = probe(server.base_url)
        assert before.status_code == 200, before.text
        shard_pids = {child.pid for child in psutil.Process(server.process.pid).children(recursive=True)}
        calls = {
            "native_stream": native_stream,
            "openai_stream": openai_stream,
            "native_generate": native_generate,
            "openai_completion": openai_completion,
        }
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            futures = {name: pool.submit(call, server.base_url) for name, call in calls.items()}
            results = {name: future.result() for name, future in futures.items()}
        failed_at = time.monotonic()
        assert_failed_in_flight(results)

        recovery_s, after = first_success_after(server, failed_at)
        print(f"\nrecovery after an injected step error: {recovery_s:.2f}s to the first successful request")
        tokens = [token["id"] for token in after["details"]["tokens"]]
        assert tokens == [token["id"] for token in before.json()["details"]["tokens"]]
        assert server.metric("tandem_shard_recoveries_total") == 1
        assert server.metric("tandem_kv_blocks_used") == 0
        log = server.log_path.read_text(errors="replace")
        assert "injected fault: rank 0 fails its forward pass in step" in log
        assert "recovered: the shards are warmed up again" in log
        assert "restarting all" not in log, "a step error is recovered in place, the shard process lives on"
        assert shard_pids <= {child.pid for child in psutil.Process(server.process.pid).children(recursive=True)}
        assert PROBE_PROMPT not in log and "Quokka-7391" not in log, "prompts are never logged by default"
        generated = after["generated_text"].strip()
        assert len(generated) >= 12, f"too short to look for in the log: {generated!r}"
        assert generated not in log, "outputs are never logged by default"
    finally:
        status = server.stop()
    assert status == 0, server.log_tail()


def stream_fails_then_recovers(server: TandemServer, error_fragment: str, fault: str) -> str:
    """A stream in flight at the fault ends with a generation error naming `error_fragment`; the probe then succeeds
    again with its greedy tokens from before the fault. Returns the launcher's log."""
    before = probe(server.base_url)
    assert before.status_code == 200, before.text
    events = native_stream(server.base_url)
    failed_at = time.monotonic()
    assert "token" in events[0] and events[-1]["error_type"] == "generation", events[-2:]
    assert error_fragment in events[-1]["error"]

    recovery_s, after = first_success_after(server, failed_at)
    print(f"\nrecovery after {fault}: {recovery_s:.2f}s to the first successful request")
    tokens = [token["id"] for token in after["details"]["tokens"]]
    assert tokens == [token["id"] for token in before.json()["details"]["tokens"]]
    return server.log_path.read_text(errors="replace")


@pytest.mark.timeout(600)
def test_a_step_error_on_one_tensor_parallel_rank_restarts_the_group(tmp_path: Path) -> None:
    flags = (*FLAGS, "--num-shard", "2", "--fault-inject-step-error", f"1:{FAULT_STEP}")
    server = TandemServer.start(tmp_path / "launcher.log", "--model-cache-dir", str(model_cache_dir()), *flags)
    try:
        log = stream_fails_then_recovers(server, "shard", "an injected step error on rank 1 of 2 (group restarted)")
        assert "injected fault: rank 1 fails its forward pass in step" in log
        assert "rank 1 failed mid-step; exiting so the shard group restarts" in log
        assert "restarting all 2 shard(s) in 1s (restart 1 of at most 3" in log
        armed = [line for line in log.splitlines() if line.startswith("[shard-") and "fault injection armed" in line]
        assert len(armed) == 1, f"only the first group is armed, the restarted one runs clean: {armed}"
    finally:
        status = server.stop()
    assert status == 0, server.log_tail()


@pytest.mark.timeout(600)
def test_a_hung_step_times_out_and_the_launcher_restarts_the_stalled_shard(tmp_path: Path) -> None:
    """The router gives up on the Step after `--step-timeout`; the shard's Health then reports the stalled model
    thread, so the launcher's health watch restarts the group."""
    flags = (
        *FLAGS,
        "--fault-inject-step-hang", f"0:{FAULT_STEP}",
        "--step-timeout", "10",
        "--shard-health-timeout", "5",
    )  # fmt: skip
    server = TandemServer.start(tmp_path / "launcher.log", "--model-cache-dir", str(model_cache_dir()), *flags)
    try:
        log = stream_fails_then_recovers(server, "no answer to Step within 10s", "a hung step")
        assert "injected fault: this step never returns" in log
        assert "restarting all 1 shard(s)" in log, server.log_tail()
    finally:
        status = server.stop()
    assert status == 0, server.log_tail()
