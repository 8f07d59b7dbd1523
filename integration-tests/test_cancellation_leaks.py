"""100 streaming client processes killed mid-flight (queued, mid chunked prefill, mid-decode): every request is
cancelled, no KV block stays allocated to a request (only prefix-cache blocks remain), nothing is left queued or
running, and the server still gives the same greedy output as before."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from tandem_harness import TandemServer, model_cache_dir

CLIENTS = 100
MAX_BATCH_PREFILL_TOKENS = 128
FLAGS = (
    "--max-batch-size", "16",
    "--max-batch-prefill-tokens", str(MAX_BATCH_PREFILL_TOKENS),
    "--kv-cache-memory", "128MiB",
    "--max-input-tokens", "1024",
    "--max-total-tokens", "1536",
)  # fmt: skip
CLIENT = Path(__file__).with_name("killed_client.py")
SETTLE_TIMEOUT_S = 30.0
FILLER = " ".join(f"the {word} crossed the river at dawn;" for word in ("fox", "heron", "otter", "lynx", "crane") * 12)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("cancellation") / "launcher.log"
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *FLAGS)
    yield server
    assert server.stop() == 0, server.log_tail()


def client_argv(server: TandemServer, index: int, chooser: random.Random) -> tuple[str, list[str]]:
    """Client `index`'s phase and argv: a third die while queued, a third mid-prefill, a third mid-decode."""
    phase = ("queued", "headers", "decode")[index % 3]
    # Unique openings keep the prefix cache from skipping the long prompts' prefill.
    prompt = f"Client {index} story:" + (f" {FILLER}" if phase == "headers" else " once upon a time")
    body = {"model": "tandem", "prompt": prompt, "max_tokens": 400, "ignore_eos": True, "stream": True}
    argument = {
        "queued": f"{chooser.uniform(0.05, 0.5):.3f}",
        "headers": f"{chooser.uniform(0.0, 0.3):.3f}",
        "decode": str(chooser.randint(1, 6)),
    }[phase]
    host, port = server.base_url.removeprefix("http://").split(":")
    return phase, [sys.executable, str(CLIENT), host, port, json.dumps(body), phase, argument]


def long_prompt_tokens(server: TandemServer) -> int:
    body = {"model": "tandem", "prompt": f"Client 0 story: {FILLER}", "max_tokens": 1}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


class QueueWatch:
    """The largest `tandem_queue_size` seen while it runs."""

    def __init__(self, server: TandemServer) -> None:
        self.largest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(server,), daemon=True)
        self._thread.start()

    def _watch(self, server: TandemServer) -> None:
        while not self._stop.wait(0.05):
            self.largest = max(self.largest, server.metric("tandem_queue_size"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.largest


def counters(server: TandemServer) -> dict[str, float]:
    """Requests arrived, succeeded and cancelled by their client (before or after admission), and the scheduler's
    count of requests it dropped because their client went away."""
    names = ("tandem_requests_total", "tandem_request_success_total", "tandem_cancelled_requests_total")
    values = {name: server.metric(name) for name in names}
    values["cancelled"] = server.metric("tandem_request_failure_total", reason="cancelled")
    return values


def settle(server: TandemServer) -> tuple[float, dict[str, float]]:
    """Seconds until nothing is queued, running or holding KV blocks, and the gauges then."""
    started = time.monotonic()
    names = ("tandem_queue_size", "tandem_running_requests", "tandem_kv_blocks_used")
    while True:
        gauges = {name: server.metric(name) for name in names}
        if not any(gauges.values()) or time.monotonic() - started > SETTLE_TIMEOUT_S:
            return time.monotonic() - started, gauges
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_killed_streaming_clients_leak_no_kv_blocks_and_are_counted_cancelled(server: TandemServer) -> None:
    assert long_prompt_tokens(server) > 3 * MAX_BATCH_PREFILL_TOKENS, "long prompts are prefilled in chunks"
    before = server.generate_ids("The capital of France is", 8)
    start = counters(server)
    chooser = random.Random(8)
    clients = [client_argv(server, index, chooser) for index in range(CLIENTS)]
    watch = QueueWatch(server)
    processes = [
        (phase, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for phase, argv in clients
    ]
    outcomes: Counter[tuple[str, str]] = Counter()
    for phase, process in processes:
        output, _ = process.communicate(timeout=120)
        assert process.returncode in (0, -9), f"{phase} client failed: {output}"
        outcomes[(phase, "killed" if process.returncode == -9 else "finished")] += 1
    killed_at = time.monotonic()
    largest_queue = watch.stop()

    settle_s, gauges = settle(server)
    killed = sum(count for (_, outcome), count in outcomes.items() if outcome == "killed")
    # The HTTP layer counts a dead client when it drops the request, which may come after the scheduler settles.
    server.wait_for_metric(
        "tandem_request_failure_total", start["cancelled"] + killed, SETTLE_TIMEOUT_S, reason="cancelled"
    )
    delta = {name: value - start[name] for name, value in counters(server).items()}
    print(
        f"\n{CLIENTS} clients: {dict(outcomes)}; settled {settle_s:.2f}s after the last death "
        f"({time.monotonic() - killed_at:.2f}s); counters {delta}; "
        f"largest queue {largest_queue:.0f}; prefix-cache blocks left {server.metric('tandem_prefix_cache_blocks'):.0f}"
    )
    assert gauges == dict.fromkeys(gauges, 0.0), f"leaked: {gauges}"
    assert largest_queue > 0, "some clients died while queued"
    assert killed >= CLIENTS - 5, outcomes
    assert delta["tandem_requests_total"] == CLIENTS
    assert delta["tandem_request_success_total"] == CLIENTS - killed
    assert delta["cancelled"] == killed
    # A client that dies while its request is still being tokenized never reaches the scheduler.
    assert 0 < delta["tandem_cancelled_requests_total"] <= killed
    assert server.generate_ids("The capital of France is", 8) == before
    assert "crossed the river at dawn" not in server.log_path.read_text(errors="replace"), "prompts are never logged"
