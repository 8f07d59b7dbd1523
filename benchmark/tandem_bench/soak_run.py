"""`tandem-bench soak`: measure capacity with a short closed loop, then hold an open loop at a fraction of it for a
long time with random client cancellations, sampling the server's memory; report growth, idle KV usage, errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from tandem_bench.client import Endpoint, build_payload, discover_model, stream_request
from tandem_bench.prometheus import parse_samples, total
from tandem_bench.run_output import print_and_save
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.soak import (
    Sample,
    SoakCounts,
    SoakSummary,
    StreamPlan,
    failures_by_reason,
    format_summary,
    parse_duration,
    plan_streams,
    process_role,
    role_memory,
)
from tandem_bench.words import WORDS

COMMAND = "tandem-bench soak"
SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SoakConfig:
    """One soak: the load shape, how long, and which process tree to sample (None: memory is not sampled)."""

    endpoint: Endpoint
    duration_s: float
    load_fraction: float
    cancel_fraction: float
    input_len: int
    output_len: int
    capacity_s: float
    capacity_concurrency: int
    sample_interval_s: float
    seed: int
    server_pid: int | None


def tree_rss(pid: int) -> dict[str, int]:
    """Resident bytes of `pid` and its descendants, summed per role (launcher, router, shards)."""
    rss: dict[str, int] = {}
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return rss
    for process in processes:
        try:
            role = process_role(process.cmdline())
            rss[role] = rss.get(role, 0) + process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return rss


async def scrape(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    async with session.get(base_url.rstrip("/") + "/metrics") as response:
        response.raise_for_status()
        return parse_samples(await response.text())


def prompt(seed: int, words: int) -> list[dict[str, str]]:
    """A fresh prompt per request, so the prefix cache cannot make the load lighter than planned."""
    return [{"role": "user", "content": " ".join(random.Random(seed).choices(WORDS, k=words))}]


async def measure_capacity(session: aiohttp.ClientSession, config: SoakConfig) -> float:
    """Completed requests per second of a closed loop of `capacity_concurrency` streams over `capacity_s`."""
    deadline = time.monotonic() + config.capacity_s
    completed = 0
    seeds = iter(range(10**9, 2 * 10**9))

    async def worker() -> None:
        nonlocal completed
        while time.monotonic() < deadline:
            result = await stream_request(
                session, config.endpoint, prompt(next(seeds), config.input_len), config.output_len
            )
            if not result.success:
                raise RuntimeError(f"capacity measurement failed: {result.error}")
            completed += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(config.capacity_concurrency)))
    return completed / (time.monotonic() - started)


async def cut_stream(session: aiohttp.ClientSession, config: SoakConfig, seed: int, chunks: int) -> bool:
    """Streams until `chunks` payloads arrived, then hangs up; False when the stream ended first."""
    payload = build_payload(config.endpoint, prompt(seed, config.input_len), config.output_len)
    async with session.post(config.endpoint.url, json=payload) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
        received = 0
        async for raw_line in response.content:
            line = raw_line.decode("utf-8").strip()
            if line == "data: [DONE]":
                return False
            if line.startswith("data:"):
                if "error" in json.loads(line[len("data:") :]):
                    raise RuntimeError(f"server error in stream: {line[:300]}")
                received += 1
                if received >= chunks:
                    response.close()  # drops the connection: the server sees the client go away
                    return True
    return False


async def one_request(
    session: aiohttp.ClientSession, config: SoakConfig, plan: StreamPlan, seed: int, counts: SoakCounts
) -> None:
    counts.sent += 1
    if plan.cancel_after_chunks is None:
        result = await stream_request(session, config.endpoint, prompt(seed, config.input_len), config.output_len)
        if result.success:
            counts.completed += 1
        else:
            counts.record_error(result.error)
        return
    try:
        if await cut_stream(session, config, seed, plan.cancel_after_chunks):
            counts.cancelled_by_client += 1
        else:
            counts.completed += 1
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        counts.record_error(f"{type(error).__name__}: {error}")


async def open_loop(session: aiohttp.ClientSession, config: SoakConfig, plans: list[StreamPlan]) -> SoakCounts:
    """Starts every planned request at its time and waits for all of them."""
    counts = SoakCounts()
    started = time.monotonic()
    tasks = []
    for index, plan in enumerate(plans):
        delay = plan.start - (time.monotonic() - started)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(session, config, plan, config.seed + index, counts)))
    await asyncio.gather(*tasks)
    return counts


async def snapshot(session: aiohttp.ClientSession, config: SoakConfig, started: float) -> Sample:
    """Resident memory of the server's processes and the router's load gauges, now."""
    metrics = await scrape(session, config.endpoint.base_url)
    return Sample(
        elapsed=time.monotonic() - started,
        rss=tree_rss(config.server_pid) if config.server_pid is not None else {},
        kv_blocks_used=total(metrics, "tandem_kv_blocks_used"),
        running=total(metrics, "tandem_running_requests"),
        queued=total(metrics, "tandem_queue_size"),
    )


async def sample_memory(
    session: aiohttp.ClientSession, config: SoakConfig, started: float, samples: list[Sample]
) -> None:
    """Appends a sample every `sample_interval_s` until cancelled."""
    while True:
        await asyncio.sleep(config.sample_interval_s)
        samples.append(await snapshot(session, config, started))


async def settle(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """The metrics once nothing runs or waits (or after SETTLE_TIMEOUT_S)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        metrics = await scrape(session, base_url)
        idle = total(metrics, "tandem_running_requests") == 0 and total(metrics, "tandem_queue_size") == 0
        if idle or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.2)


async def soak(config: SoakConfig) -> SoakSummary:
    """Capacity, then the soak phase, then the idle state; memory is sampled from before the first soak request
    (the server idle and warmed up by the capacity run) to after the last one settled."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if not config.endpoint.model:
            config = SoakConfig(**{**vars(config), "endpoint": await _named(session, config.endpoint)})
        capacity = await measure_capacity(session, config)
        target = capacity * config.load_fraction
        print(f"capacity {capacity:.2f} req/s; soaking at {target:.2f} req/s for {config.duration_s:.0f}s", flush=True)
        plans = plan_streams(target, config.duration_s, config.cancel_fraction, config.output_len, config.seed)
        before = await settle(session, config.endpoint.base_url)
        started = time.monotonic()
        samples = [await snapshot(session, config, started)]
        sampler = asyncio.create_task(sample_memory(session, config, started, samples))
        counts = await open_loop(session, config, plans)
        load_s = time.monotonic() - started
        after = await settle(session, config.endpoint.base_url)
        sampler.cancel()
        samples.append(await snapshot(session, config, started))
    counts.server_cancelled = total(after, "tandem_cancelled_requests_total") - total(
        before, "tandem_cancelled_requests_total"
    )
    counts.server_failures = failures_by_reason(before, after)
    roles = sorted({role for sample in samples for role in sample.rss})
    return SoakSummary(
        duration_s=load_s,
        capacity_rps=capacity,
        target_rps=target,
        achieved_rps=counts.sent / config.duration_s,
        counts=counts,
        memory={role: memory for role in roles if (memory := role_memory(samples, role)) is not None},
        idle_kv_blocks_used=total(after, "tandem_kv_blocks_used"),
        idle_prefix_cache_blocks=total(after, "tandem_prefix_cache_blocks"),
        samples=samples,
    )


async def _named(session: aiohttp.ClientSession, endpoint: Endpoint) -> Endpoint:
    model = await discover_model(session, endpoint.base_url, endpoint.api_key)
    return Endpoint(endpoint.name, endpoint.base_url, endpoint.api, model, endpoint.temperature, endpoint.extra_body)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--base-url", default=None, help="soak this running server instead of starting Tandem")
    parser.add_argument("--server-pid", type=int, default=None, help="with --base-url: sample this process tree's RSS")
    parser.add_argument("--duration", type=_duration, default=parse_duration("30m"), help="e.g. 30m, 10m, 1h, 90s")
    parser.add_argument("--load-fraction", type=_fraction, default=0.5, help="open-loop rate as a share of capacity")
    parser.add_argument("--cancel-fraction", type=_fraction, default=0.2, help="share of streams closed early")
    parser.add_argument("--capacity-duration", type=_duration, default=parse_duration("60s"))
    parser.add_argument("--capacity-concurrency", type=int, default=16, help="closed-loop streams measuring capacity")
    parser.add_argument("--input-len", type=int, default=64, help="prompt words (about one token each)")
    parser.add_argument("--output-len", type=int, default=64, help="tokens per request (ignore_eos)")
    parser.add_argument("--sample-interval", type=_duration, default=parse_duration("10s"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-memory", default="1GiB", help="passed to the launcher when starting Tandem")
    parser.add_argument("--output", type=Path, default=None, help="write the summary and every sample as JSON")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    return parser


def _config(args: argparse.Namespace, base_url: str, server_pid: int | None) -> SoakConfig:
    return SoakConfig(
        endpoint=Endpoint(name="soak", base_url=base_url, extra_body={"ignore_eos": True}),
        duration_s=args.duration,
        load_fraction=args.load_fraction,
        cancel_fraction=args.cancel_fraction,
        input_len=args.input_len,
        output_len=args.output_len,
        capacity_s=args.capacity_duration,
        capacity_concurrency=args.capacity_concurrency,
        sample_interval_s=args.sample_interval,
        seed=args.seed,
        server_pid=server_pid,
    )


def _run(args: argparse.Namespace) -> SoakSummary:
    if args.base_url:
        return asyncio.run(soak(_config(args, args.base_url, args.server_pid)))
    launcher_args = ["--kv-cache-memory", args.kv_cache_memory]
    with LaunchedTandem(args.log_dir / "soak-launcher.log", launcher_args) as tandem:
        print(f"Tandem is up at {tandem.base_url}", flush=True)
        pid = tandem.process.pid if tandem.process is not None else None
        return asyncio.run(soak(_config(args, tandem.base_url, pid)))


def main(argv: list[str]) -> int:
    """Runs the soak and prints the summary; 1 when any request failed, 2 when the server is unusable."""
    args = build_parser().parse_args(argv)
    try:
        summary = _run(args)
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    print_and_save(COMMAND, argv, format_summary(summary), summary.to_dict(), args.output)
    return 1 if summary.counts.errors else 0
