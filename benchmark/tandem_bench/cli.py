"""`tandem-bench`: command-line flags to a benchmark run, then printed figures, JSON results and plots."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from tandem_bench import (
    agent_run,
    fair_run,
    hostile_run,
    hybrid_run,
    images_run,
    kv_memory_run,
    lora_run,
    moe_run,
    overhead_run,
    quantized_run,
    soak_run,
    speculative_run,
)
from tandem_bench.client import API_PATHS, Endpoint, extra_body
from tandem_bench.datasets import DATASET_KINDS, DatasetConfig
from tandem_bench.load import LoadPoint
from tandem_bench.plots import write_plots
from tandem_bench.report import format_ratios, format_run, format_table
from tandem_bench.results import results_document, write_results
from tandem_bench.runner import BenchConfig, run_benchmark_sync


def parse_server(spec: str) -> tuple[str, str]:
    """`name=URL` or a bare URL (named by its host:port)."""
    name, sep, url = spec.partition("=")
    if not sep or "/" in name or ":" in name:
        url = spec
        parsed = urlparse(url)
        name = parsed.netloc or url
    if not urlparse(url).scheme.startswith("http"):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {url!r}")
    return name, url


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem-bench",
        description="Streams load at OpenAI-compatible servers; reports throughput, TTFT, TPOT, ITL and E2E latency. "
        "`tandem-bench overhead --help`: Tandem's per-step overhead against the forward pass; "
        "`tandem-bench soak --help`: a long run at half capacity with cancellations, watching memory and KV usage; "
        "`tandem-bench hostile --help`: what floods of hostile requests cost a concurrent stream and the router's "
        "memory; `tandem-bench kv-memory --help`: the shards' peak memory while long prompts fill the KV cache; "
        "`tandem-bench speculative --help`: single-stream speed with and without speculative decoding; "
        "`tandem-bench quantized --help`: the embedded GGUF served float32 and quantized, side by side; "
        "`tandem-bench moe --help`: a tiny mixture-of-experts model at 32 streams against transformers static "
        "batching; `tandem-bench hybrid --help`: a tiny hybrid (recurrent-state) model at 32 streams against "
        "transformers static batching, and multi-turn chats' time to first token with and without the prefix cache; "
        "`tandem-bench lora --help`: 32 streams spread over four LoRA adapters against the base model alone; "
        "`tandem-bench images --help`: time to first token of chat requests with images, fresh against repeated; "
        "`tandem-bench fair --help`: one API key's burst against another key's trickle under fcfs and fair; "
        "`tandem-bench agent --help`: agent sessions that outgrow the KV cache, with and without KV offload.",
    )
    target = parser.add_argument_group("servers")
    target.add_argument("--base-url", default="http://127.0.0.1:3000", help="server to measure")
    target.add_argument(
        "--compare",
        nargs="+",
        type=parse_server,
        metavar="[NAME=]URL",
        help="measure several servers (the first is the baseline); replaces --base-url",
    )
    target.add_argument("--api", choices=sorted(API_PATHS), default="completions", help="endpoint to stream from")
    target.add_argument("--model", default="", help="model name (default: the first id of /v1/models)")
    target.add_argument("--api-key", default=None, help="sent as a Bearer token")
    target.add_argument("--temperature", type=float, default=0.0)
    target.add_argument(
        "--extra-body",
        type=extra_body,
        default={},
        help="JSON merged into every request, e.g. '{\"ignore_eos\": true}'",
    )
    data = parser.add_argument_group("workload")
    data.add_argument("--dataset", choices=DATASET_KINDS, default="random")
    data.add_argument(
        "--num-prompts",
        type=_positive_int,
        default=100,
        help="conversations per run (one request each except multi-turn, which sends --num-turns)",
    )
    data.add_argument("--input-len", type=_positive_int, default=64, help="prompt words (about one token each)")
    data.add_argument("--output-len", type=_positive_int, default=64, help="max_tokens of each request")
    data.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1±r)")
    data.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: words of each system prompt")
    data.add_argument("--num-prefixes", type=_positive_int, default=4, help="shared-prefix: distinct system prompts")
    data.add_argument("--num-turns", type=_positive_int, default=3, help="multi-turn: turns per conversation")
    data.add_argument("--seed", type=int, default=0)
    load = parser.add_argument_group("load")
    load.add_argument("--concurrency", type=_positive_int, nargs="+", default=[], help="closed loop; several sweep")
    load.add_argument(
        "--request-rate",
        type=_positive_float,
        nargs="+",
        default=[],
        help="open loop, requests/s (inf: all at once); several values sweep",
    )
    load.add_argument("--burstiness", type=_positive_float, default=1.0, help="gamma shape of arrivals; 1 is Poisson")
    load.add_argument("--max-concurrency", type=_positive_int, default=None, help="open loop: cap in flight")
    load.add_argument(
        "--warmup", type=int, default=1, help="unmeasured requests sent to each server first, all at once"
    )
    load.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, default=None, help="write results as JSON")
    out.add_argument("--plot-dir", type=Path, default=None, help="write throughput and latency PNGs here")
    out.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Turns parsed flags into a `BenchConfig`; with neither load flag, runs closed loop at concurrency 1."""
    servers = args.compare or [parse_server(args.base_url)]
    endpoints = [
        Endpoint(
            name=name,
            base_url=url,
            api=args.api,
            model=args.model,
            temperature=args.temperature,
            extra_body=args.extra_body,
            api_key=args.api_key,
        )
        for name, url in servers
    ]
    concurrencies = args.concurrency or ([] if args.request_rate else [1])
    points = [LoadPoint(concurrency=n) for n in concurrencies] + [
        LoadPoint(request_rate=rate, burstiness=args.burstiness, max_concurrency=args.max_concurrency)
        for rate in args.request_rate
    ]
    dataset = DatasetConfig(
        kind=args.dataset,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        prefix_len=args.prefix_len,
        num_prefixes=args.num_prefixes,
        num_turns=args.num_turns,
        seed=args.seed,
    )
    return BenchConfig(
        endpoints=endpoints,
        points=points,
        dataset=dataset,
        warmup_requests=args.warmup,
        show_progress=not args.no_progress,
        request_timeout_s=args.timeout,
    )


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "overhead": overhead_run.main,
    "soak": soak_run.main,
    "hostile": hostile_run.main,
    "kv-memory": kv_memory_run.main,
    "speculative": speculative_run.main,
    "quantized": quantized_run.main,
    "moe": moe_run.main,
    "hybrid": hybrid_run.main,
    "lora": lora_run.main,
    "images": images_run.main,
    "agent": agent_run.main,
    "fair": fair_run.main,
}


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; exits 1 when any request failed, 2 on a bad invocation or unreachable server."""
    arguments = sys.argv[1:] if argv is None else argv
    subcommand = SUBCOMMANDS.get(arguments[0]) if arguments else None
    if subcommand is not None:
        return subcommand(arguments[1:])
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    try:
        records = run_benchmark_sync(config)
    except RuntimeError as error:
        print(f"tandem-bench: {error}", file=sys.stderr)
        return 2
    for record in records:
        print(format_run(record))
    print()
    print(format_table(records))
    if len(config.endpoints) > 1:
        print(f"\nRatios against {config.endpoints[0].name} (same invocation, interleaved):")
        print(format_ratios(records, config.endpoints[0].name))
    command = shlex.join(["tandem-bench", *(sys.argv[1:] if argv is None else argv)])
    if args.output:
        write_results(args.output, results_document(config, records, command))
        print(f"\nresults: {args.output}")
    if args.plot_dir:
        for path in write_plots(records, args.plot_dir):
            print(f"plot: {path}")
    return 1 if any(record.summary.failed for record in records) else 0
