"""Starts Tandem through its launcher on a free loopback port, waits until it answers, and stops it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import TypeVar

READY_TIMEOUT_S = 900.0
_Server = TypeVar("_Server", bound="LaunchedServer")
STOP_TIMEOUT_S = 120.0


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class LaunchedServer:
    """Context manager around one server process on a free loopback port: started with its output in `log_path`,
    awaited until `/health` answers 200, stopped with SIGTERM (then SIGKILL if it overstays)."""

    name = "server"
    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.args: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self: _Server) -> _Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while not _healthy(self.base_url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not become ready; its log: {self.log_path}")
            time.sleep(0.5)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LaunchedTandem(LaunchedServer):
    """`python -m tandem_launcher --port P`; on SIGTERM the launcher drains and stops its children."""

    name = "Tandem"

    def __init__(self, log_path: Path, launcher_args: list[str] | None = None, api_key: str | None = None) -> None:
        super().__init__(log_path)
        self.args = [sys.executable, "-m", "tandem_launcher", "--port", str(self.port), *(launcher_args or [])]
        # Sent with the readiness probes when the launcher flags configure API keys.
        self.api_key = api_key

    def __enter__(self) -> LaunchedTandem:
        started = time.monotonic()
        super().__enter__()
        # Measured once its background compile has finished: the steady state users get a minute after start.
        deadline = started + self.ready_timeout_s
        waited = False
        while compiling(self.base_url, self.api_key):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} still compiled after {self.ready_timeout_s:.0f}s: {self.log_path}")
            waited = True
            time.sleep(2.0)
        if waited:
            print(f"{self.name}: background compile done {time.monotonic() - started:.0f}s after start", flush=True)
        return self


def compiling(base_url: str, api_key: str | None = None) -> bool:
    """Whether Tandem's shards still compile in the background, as `/info` reports after one step (which this
    sends: the shards report their compile state with each step); `api_key` authorizes both when keys are set."""
    authorization = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(
        f"{base_url}/generate",
        data=json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 1}}).encode(),
        headers={"Content-Type": "application/json", **authorization},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return bool(_info(base_url, authorization).get("compiling"))


def _info(base_url: str, headers: dict[str, str]) -> dict[str, object]:
    request = urllib.request.Request(f"{base_url}/info", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        info: dict[str, object] = json.loads(response.read())
    return info
