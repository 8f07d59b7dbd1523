"""`tandem-bench hostile`: what hostile but well-formed requests cost everyone else. Measures, against a baseline
taken in the same run: the router's peak RSS under concurrent multi-megabyte `/tokenize` requests, a greedy stream's
latency alone and beside a flood of deep health probes, and its inter-token latency beside one request with the
largest allowed `logit_bias`, `stop_token_ids` and `n`."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from tandem_bench.client import Endpoint, RequestResult, discover_model, stream_request
from tandem_bench.hostile import HostileReport, StreamBeside, TokenizeFlood, format_report
from tandem_bench.run_output import print_and_save
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.soak import process_role
from tandem_bench.words import WORDS

COMMAND = "tandem-bench hostile"
RSS_SAMPLE_S = 0.02
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


@dataclass(frozen=True)
class HostileConfig:
    """One run's server, its router process (None: RSS is not measured) and the hostile loads' sizes."""

    endpoint: Endpoint
    router_pid: int | None
    tokenize_requests: int
    tokenize_bytes: int
    probes: int
    # Seconds each prober waits between its probes; 0: it probes again as soon as answered.
    probe_interval_s: float
    output_len: int
    logit_bias_entries: int
    stop_token_ids: int
    n: int


def words_text(size: int, seed: int) -> str:
    """About `size` bytes of space-separated common words."""
    rng = random.Random(seed)
    pieces: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        pieces.append(word)
        length += len(word) + 1
    return " ".join(pieces)[:size]


def router_pid(launcher_pid: int) -> int | None:
    """The router among the launcher's descendants."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if process_role(child.cmdline()) == "router":
                return int(child.pid)
        except psutil.NoSuchProcess:
            continue
    return None


async def _sample_peak(pid: int, stop: asyncio.Event) -> int:
    process = psutil.Process(pid)
    peak = process.memory_info().rss
    while not stop.is_set():
        peak = max(peak, process.memory_info().rss)
        await asyncio.sleep(RSS_SAMPLE_S)
    return max(peak, process.memory_info().rss)


async def _status_of(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> int:
    try:
        async with session.request(method, url, json=body) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 0


async def tokenize_flood(session: aiohttp.ClientSession, config: HostileConfig) -> TokenizeFlood | None:
    """`tokenize_requests` concurrent `/tokenize` calls of `tokenize_bytes` each, sampling the router's RSS."""
    if config.router_pid is None:
        return None
    await asyncio.sleep(1.0)
    idle = psutil.Process(config.router_pid).memory_info().rss
    url = config.endpoint.base_url.rstrip("/") + "/tokenize"
    bodies = [{"inputs": words_text(config.tokenize_bytes, seed)} for seed in range(config.tokenize_requests)]
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_peak(config.router_pid, stop))
    statuses = await asyncio.gather(*(_status_of(session, "POST", url, body) for body in bodies))
    await asyncio.sleep(0.5)
    stop.set()
    peak = await sampler
    return TokenizeFlood(config.tokenize_requests, config.tokenize_bytes, idle, peak, dict(Counter(statuses)))


async def _greedy_stream(session: aiohttp.ClientSession, config: HostileConfig) -> RequestResult:
    result = await stream_request(session, config.endpoint, PROMPT, config.output_len)
    if not result.success:
        raise RuntimeError(f"the measured stream failed: {result.error}")
    return result


async def beside_probes(session: aiohttp.ClientSession, config: HostileConfig, alone: RequestResult) -> StreamBeside:
    """The stream again while `probes` clients ask `/health?deep=true` in a loop until it ends."""
    url = config.endpoint.base_url.rstrip("/") + "/health?deep=true"
    done = asyncio.Event()
    statuses: Counter[int] = Counter()

    async def prober() -> None:
        while not done.is_set():
            statuses[await _status_of(session, "GET", url)] += 1
            if config.probe_interval_s:
                await asyncio.sleep(config.probe_interval_s)

    probers = [asyncio.create_task(prober()) for _ in range(config.probes)]
    await asyncio.sleep(0.2)
    beside = await _greedy_stream(session, config)
    done.set()
    await asyncio.gather(*probers)
    pace = f" every {config.probe_interval_s:g} s" if config.probe_interval_s else ""
    hostile = f"{config.probes} clients probing /health?deep=true{pace}"
    return _beside(hostile, alone, beside, dict(statuses))


def heavy_body(config: HostileConfig) -> dict[str, Any]:
    """A completion with the largest `logit_bias`, `stop_token_ids` and `n` the server's defaults allow."""
    bias = {str(token): -1.0 for token in range(1000, 1000 + config.logit_bias_entries)}
    return {
        "model": config.endpoint.model,
        "prompt": words_text(2000, 7),
        "max_tokens": config.output_len,
        "temperature": 1.0,
        "seed": 1,
        "n": config.n,
        "logit_bias": bias,
        "stop_token_ids": list(range(2000, 2000 + config.stop_token_ids)),
        "ignore_eos": True,
    }


async def beside_heavy(session: aiohttp.ClientSession, config: HostileConfig, alone: RequestResult) -> StreamBeside:
    """The stream again beside one request with the largest allowed bias, stop-token and choice counts."""
    url = config.endpoint.base_url.rstrip("/") + "/v1/completions"
    heavy = asyncio.create_task(_status_of(session, "POST", url, heavy_body(config)))
    await asyncio.sleep(0.5)
    beside = await _greedy_stream(session, config)
    status = await heavy
    hostile = f"n={config.n}, {config.logit_bias_entries} logit_bias, {config.stop_token_ids} stop_token_ids"
    return _beside(hostile, alone, beside, {status: 1})


def _beside(hostile: str, alone: RequestResult, beside: RequestResult, statuses: dict[int, int]) -> StreamBeside:
    return StreamBeside(hostile, alone.e2e, beside.e2e, alone.itl, beside.itl, alone.text == beside.text, statuses)


async def hostile(config: HostileConfig) -> HostileReport:
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = await discover_model(session, config.endpoint.base_url)
        config = replace(config, endpoint=replace(config.endpoint, model=model))
        report = HostileReport()
        await _greedy_stream(session, config)
        started = time.perf_counter()
        alone = await _greedy_stream(session, config)
        print(f"stream alone: {alone.e2e * 1000:.0f} ms ({time.perf_counter() - started:.1f}s)", flush=True)
        report.beside.append(await beside_probes(session, config, alone))
        report.beside.append(await beside_heavy(session, config, alone))
        report.tokenize = await tokenize_flood(session, config)
        return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--base-url", default=None, help="measure this running server instead of starting Tandem")
    parser.add_argument("--router-pid", type=int, default=None, help="with --base-url: the router whose RSS to sample")
    parser.add_argument("--tokenize-requests", type=int, default=24)
    parser.add_argument("--tokenize-bytes", type=int, default=1_990_000, help="input size of each /tokenize request")
    parser.add_argument("--probes", type=int, default=200, help="concurrent deep health probers")
    parser.add_argument("--probe-interval", type=float, default=0.0, help="seconds between one prober's probes")
    parser.add_argument("--output-len", type=int, default=64, help="tokens of the measured stream (ignore_eos)")
    parser.add_argument("--logit-bias-entries", type=int, default=300)
    parser.add_argument("--stop-token-ids", type=int, default=64)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--kv-cache-memory", default="512MiB", help="passed to the launcher when starting Tandem")
    parser.add_argument("--output", type=Path, default=None, help="write every measurement as JSON")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    return parser


def _config(args: argparse.Namespace, base_url: str, pid: int | None) -> HostileConfig:
    return HostileConfig(
        endpoint=Endpoint(name="hostile", base_url=base_url, extra_body={"ignore_eos": True}),
        router_pid=pid,
        tokenize_requests=args.tokenize_requests,
        tokenize_bytes=args.tokenize_bytes,
        probes=args.probes,
        probe_interval_s=args.probe_interval,
        output_len=args.output_len,
        logit_bias_entries=args.logit_bias_entries,
        stop_token_ids=args.stop_token_ids,
        n=args.n,
    )


def _run(args: argparse.Namespace) -> HostileReport:
    if args.base_url:
        return asyncio.run(hostile(_config(args, args.base_url, args.router_pid)))
    launcher_args = ["--kv-cache-memory", args.kv_cache_memory]
    with LaunchedTandem(args.log_dir / "hostile-launcher.log", launcher_args) as tandem:
        print(f"Tandem is up at {tandem.base_url}", flush=True)
        pid = router_pid(tandem.process.pid) if tandem.process is not None else None
        return asyncio.run(hostile(_config(args, tandem.base_url, pid)))


def main(argv: list[str]) -> int:
    """Runs every measurement and prints the table; 2 when the server is unusable."""
    args = build_parser().parse_args(argv)
    try:
        report = _run(args)
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    print_and_save(COMMAND, argv, format_report(report), report.to_dict(), args.output)
    return 0
