"""In-process decode steps of the embedded model: one request at a time, as a shard runs them, timed step by step.

Run: uv run --no-sync python benchmark/scripts/decode_step.py [--quantize gguf] [--dtype float32|bfloat16]
[--torch-compile] [--requests 3] [--steps 70] [--threads 2]. Each request prefills a 40-token prompt, decodes 5 steps
untimed, then `--steps` timed ones; prints the 10th percentile, median and mean step in ms as JSON. The model loads
and steps on one thread other than the main one, as in the shard (one torch thread pool).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
from tandem_server.bootstrap import load_shard
from tandem_server.config import CompileMode, ShardConfig
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StoppingCriteria, WarmupPlan
from tandem_server.quant.mode import QuantizeMode
from tandem_server.sampling.params import SamplingParams

BLOCK_SIZE, PROMPT_TOKENS, UNTIMED_STEPS = 16, 40, 5


def decode_times(runner: ModelRunner, request_id: int, steps: int) -> list[float]:
    """Milliseconds of each timed decode step of one greedy request; its blocks are 0.. in order."""
    total = PROMPT_TOKENS + UNTIMED_STEPS + steps
    blocks = tuple(range(-(-total // BLOCK_SIZE)))
    request = NewRequest(
        id=request_id,
        token_ids=tuple(range(1000, 1000 + PROMPT_TOKENS)),
        num_output_tokens=0,
        sampling=SamplingParams(),
        stopping=StoppingCriteria(max_new_tokens=UNTIMED_STEPS + steps + 1),
    )
    runner.step(StepInput((request,), (ScheduledRequest(request_id, PROMPT_TOKENS, blocks, 0),)))
    times = []
    for done in range(PROMPT_TOKENS, total):
        started = time.perf_counter()
        runner.step(StepInput(scheduled=(ScheduledRequest(request_id, 1, (), done),)))
        if done >= PROMPT_TOKENS + UNTIMED_STEPS:
            times.append((time.perf_counter() - started) * 1e3)
    runner.step(StepInput(finished=(request_id,)))
    return times


def measure(args: argparse.Namespace) -> dict[str, float | str]:
    torch.set_num_threads(args.threads)
    config = ShardConfig(
        model_path=converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR),
        uds_path=Path("unused.sock"),
        quantize=QuantizeMode(args.quantize),
        dtype=getattr(torch, args.dtype),
        num_threads=args.threads,
        kv_cache_memory=256 * 1024**2,
        decode_mirror_memory=128 * 1024**2,
        quantized_dense_memory=0,
        torch_compile=CompileMode.WARMUP if args.torch_compile else CompileMode.OFF,
    )
    runner = load_shard(config).runner
    runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=512, max_batch_requests=32))
    times = [t for request_id in range(args.requests) for t in decode_times(runner, request_id, args.steps)]
    deciles = statistics.quantiles(times, n=10)
    return {
        "quantize": args.quantize,
        "dtype": args.dtype,
        "torch_compile": args.torch_compile,
        "steps": len(times),
        "p10_ms": round(deciles[0], 2),
        "median_ms": round(deciles[4], 2),
        "mean_ms": round(statistics.mean(times), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quantize", default="none", choices=[mode.value for mode in QuantizeMode])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-compile", action="store_true", help="the shard's --torch-compile")
    args = parser.parse_args()
    results: list[dict[str, float | str]] = []
    # Loading and stepping on one thread gives torch one OpenMP pool, as the shard's model thread does.
    worker = threading.Thread(target=lambda: results.append(measure(args)))
    worker.start()
    worker.join()
    print(json.dumps(results[0]))


if __name__ == "__main__":
    main()
