"""`tandem-bench hybrid`: a tiny random-weight hybrid model (recurrent layers beside attention) served by Tandem, in
two workloads.

throughput: `--streams` concurrent greedy requests through the launcher against `transformers` static batching (one
`generate` over the same prompts, left-padded, same dtype and output length), run right before and right after
Tandem and averaged.

multi-turn: `--conversations` chats of `--turns` turns run at once over one long shared system prompt, each turn
re-sending the whole history through `/v1/chat/completions`; the time to first token of every turn on a Tandem with
its default settings against one started with `--prefix-caching false`, side by side and in turns (`--chat-rounds`),
and the prefix cache's hit tokens from `/metrics`.

The checkpoint is drawn once into the log directory with the embedded model's tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tandem_bench.client import Endpoint
from tandem_bench.cpu_features import cpu_features
from tandem_bench.datasets import random_text
from tandem_bench.hybrid_model import FAMILIES, describe_model, write_tiny_hybrid
from tandem_bench.hybrid_report import (
    ChatRun,
    ThroughputFigures,
    format_throughput,
    format_turns,
    multi_turn_document,
)
from tandem_bench.multi_turn import ChatShape, build_conversations, run_chats
from tandem_bench.results import write_results
from tandem_bench.runner import warm_up
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import metric_total, post_completion, served_model

COMMAND = "tandem-bench hybrid"
WORKLOADS = ("throughput", "multi-turn")
PADDED_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "transformers_padded.py"
CACHE_OFF_FLAGS = ["--prefix-caching", "false"]
HITS = "tandem_prefix_cache_hits_tokens_total"
QUERIES = "tandem_prefix_cache_queries_tokens_total"
WARMUP_SEED = 1_000_003


def throughput_prompts(streams: int, words: int, seed: int = 0) -> list[str]:
    """One prompt of `words` random common words per stream (about one token each)."""
    rng = random.Random(seed)
    return [random_text(rng, words) for _ in range(streams)]


def transformers_tok_s(model_dir: Path, prompts_file: Path, output_len: int, dtype: str) -> float:
    """One left-padded `generate` over the prompts, in its own process so its torch threads share nothing with ours."""
    command = [sys.executable, str(PADDED_SCRIPT), "--model-dir", str(model_dir), "--prompts", str(prompts_file)]
    command += ["--output-len", str(output_len), "--dtype", dtype]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    return float(result["tokens"]) / float(result["seconds"])


def tandem_round(base_url: str, model: str, prompts: list[str], output_len: int) -> tuple[int, float]:
    """Every prompt at once as one greedy, non-streamed completion of exactly `output_len` tokens; returns the output
    tokens and the wall time until the last one ended."""
    bodies = [
        {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
        for prompt in prompts
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(post_completion, [base_url] * len(bodies), bodies))
    seconds = time.perf_counter() - started
    tokens = 0
    for answer in answers:
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            raise RuntimeError(f"a completion without usage: {answer}")
        tokens += int(usage["completion_tokens"])
    return tokens, seconds


def tandem_tok_s(base_url: str, prompts: list[str], args: argparse.Namespace) -> float:
    """Output tokens per second over `args.rounds` rounds, after one unmeasured round."""
    model = served_model(base_url)
    tandem_round(base_url, model, prompts, args.output_len)
    rounds = [tandem_round(base_url, model, prompts, args.output_len) for _ in range(args.rounds)]
    return sum(tokens for tokens, _ in rounds) / sum(seconds for _, seconds in rounds)


def served_info(base_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base_url}/info", timeout=30) as response:
        info: dict[str, Any] = json.loads(response.read())
    return info


def chat_endpoint(base_url: str) -> Endpoint:
    """Streamed chat completions of exactly the requested length from the server at `base_url`."""
    return Endpoint(
        name=base_url, base_url=base_url, api="chat", model=served_model(base_url), extra_body={"ignore_eos": True}
    )


def chat_run(endpoint: Endpoint, shape: ChatShape, timeout_s: float) -> ChatRun:
    """Runs the conversations of `shape`, scraping the prefix cache's counters around them."""
    base_url = endpoint.base_url
    hits, queries = metric_total(base_url, HITS), metric_total(base_url, QUERIES)
    timings = asyncio.run(run_chats(endpoint, build_conversations(shape), timeout_s))
    return ChatRun(
        timings=timings,
        prefix_caching=bool(served_info(base_url).get("prefix_caching")),
        queried_tokens=metric_total(base_url, QUERIES) - queries,
        hit_tokens=metric_total(base_url, HITS) - hits,
    )


def interleaved_chats(base_urls: list[str], shape: ChatShape, rounds: int, timeout_s: float) -> list[ChatRun]:
    """Warms each server with short chats, then runs `rounds` rounds of chats on each in turns, the order reversed
    every round so drift in the machine's speed favours neither; each round has its own system prompt and messages,
    so no round finds another's prefixes cached. Returns each server's rounds combined."""
    endpoints = [chat_endpoint(base_url) for base_url in base_urls]
    for endpoint in endpoints:
        asyncio.run(warm_up(endpoint, shape.conversations, WARMUP_SEED))
    runs: list[list[ChatRun]] = [[] for _ in endpoints]
    for index in range(rounds):
        order = list(range(len(endpoints)))
        for server in order if index % 2 == 0 else order[::-1]:
            runs[server].append(chat_run(endpoints[server], replace(shape, seed=shape.seed + index), timeout_s))
    return [ChatRun.combine(server_runs) for server_runs in runs]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_5", help="the hybrid's layout")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="workloads to run")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16", help="both sides' dtype")
    throughput = parser.add_argument_group("throughput")
    throughput.add_argument("--streams", type=int, default=32, help="concurrent requests, and the baseline's batch")
    throughput.add_argument("--input-len", type=int, default=50, help="prompt words (about one token each)")
    throughput.add_argument("--output-len", type=int, default=128, help="tokens each request generates")
    throughput.add_argument("--rounds", type=int, default=2, help="measured rounds of Tandem, after one unmeasured")
    chats = parser.add_argument_group("multi-turn")
    chats.add_argument("--conversations", type=int, default=4, help="chats run at once")
    chats.add_argument("--turns", type=int, default=5, help="turns per chat")
    chats.add_argument("--system-words", type=int, default=600, help="words of the shared system prompt")
    chats.add_argument("--user-words", type=int, default=40, help="words of each user message")
    chats.add_argument("--answer-len", type=int, default=32, help="tokens of each answer")
    chats.add_argument("--chat-rounds", type=int, default=2, help="rounds of chats on each server, in turns")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags for every Tandem (one string)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout of the chats (s)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "hybrid")
    parser.add_argument("--output", type=Path, default=None, help="the JSON results (default: LOG_DIR/results.json)")
    return parser


def _model_dir(args: argparse.Namespace) -> Path:
    """The family's checkpoint in `args.dtype`, drawn on first use."""
    from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR  # noqa: PLC0415
    from tandem_launcher.embedded import converted_model_dir, embedded_gguf  # noqa: PLC0415

    model_dir = args.log_dir / f"tiny-{args.family}-{args.dtype}"
    if not (model_dir / "config.json").is_file():
        write_tiny_hybrid(
            model_dir, converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR), args.family, args.dtype
        )
    return model_dir


def _load_average() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def _measure(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Runs the chosen workloads; returns their sections of the results document, printing each as it ends."""
    flags = ["--model-id", str(model_dir), "--dtype", args.dtype, *shlex.split(args.launcher_args)]
    shape = ChatShape(args.conversations, args.turns, args.system_words, args.user_words, args.answer_len)
    prompts = throughput_prompts(args.streams, args.input_len)
    prompts_file = args.log_dir / "throughput-prompts.json"
    prompts_file.write_text(json.dumps(prompts) + "\n", encoding="utf-8")
    measure_throughput = "throughput" in args.only
    baseline = []
    if measure_throughput:
        baseline.append(transformers_tok_s(model_dir, prompts_file, args.output_len, args.dtype))
    with contextlib.ExitStack() as servers:
        default = servers.enter_context(LaunchedTandem(args.log_dir / "tandem.log", flags))
        tandem = tandem_tok_s(default.base_url, prompts, args) if measure_throughput else 0.0
        chats = None
        if "multi-turn" in args.only:
            # Started once the throughput is measured, so its start-up shares no core with the measured streams.
            cache_off_log = args.log_dir / "tandem-prefix-cache-off.log"
            cache_off = servers.enter_context(LaunchedTandem(cache_off_log, [*flags, *CACHE_OFF_FLAGS]))
            chats = interleaved_chats([default.base_url, cache_off.base_url], shape, args.chat_rounds, args.timeout)
    sections: dict[str, Any] = {}
    if measure_throughput:
        baseline.append(transformers_tok_s(model_dir, prompts_file, args.output_len, args.dtype))
        figures = ThroughputFigures(args.streams, tandem, sum(baseline) / len(baseline), len(baseline))
        print(f"\nThroughput: {args.streams} prompts of {args.input_len} words, {args.output_len} tokens each\n")
        print(format_throughput(figures, args.rounds))
        sections["throughput"] = figures.to_dict()
    if chats is not None:
        cached, uncached = chats
        print(
            f"\nMulti-turn: {shape.conversations} chats at once, {shape.turns} turns, a {shape.system_words}-word "
            f"system prompt, {shape.user_words}-word messages, {shape.output_len}-token answers; {args.chat_rounds} "
            "rounds on each server in turns\n"
        )
        print(format_turns(cached, uncached))
        sections["multi_turn"] = {
            "shape": asdict(shape),
            "rounds": args.chat_rounds,
            **multi_turn_document(cached, uncached),
        }
    return sections


def main(argv: list[str] | None = None) -> int:
    """Runs the workloads, prints their tables and writes the results file; 2 when a server cannot be started."""
    arguments = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(arguments)
    when = datetime.now(timezone.utc)
    load_before = _load_average()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = _model_dir(args)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    cpu = cpu_features()
    print(f"{describe_model(config)}, {args.dtype}; {cpu.describe()}", flush=True)
    try:
        sections = _measure(args, model_dir)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
        detail = f"\n{error.stderr[-2000:]}" if isinstance(error, subprocess.CalledProcessError) else ""
        print(f"{COMMAND}: {error}{detail}", file=sys.stderr)
        return 2
    command = shlex.join([*COMMAND.split(), *arguments])
    load_after = _load_average()
    print(
        f"\nMeasured {when:%Y-%m-%d %H:%M} UTC with `{command}` (load average {load_before} before, {load_after} after)"
    )
    document = {
        "date": when.isoformat(timespec="seconds"),
        "command": command,
        "cpu": cpu.to_dict(),
        "load_average": {"before": load_before, "after": load_after},
        "model": {"family": args.family, "dtype": args.dtype, "description": describe_model(config)},
        **sections,
    }
    output = args.output or args.log_dir / "results.json"
    write_results(output, document)
    print(f"results: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
