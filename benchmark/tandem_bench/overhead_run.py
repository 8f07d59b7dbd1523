"""`tandem-bench overhead`: B concurrent decode streams per batch size, step histograms scraped around the decode."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp

from tandem_bench.client import discover_model
from tandem_bench.overhead import StepBreakdown, format_table, step_breakdown
from tandem_bench.prometheus import parse_samples
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.words import WORDS

COMMAND = "tandem-bench overhead"


@dataclass(frozen=True)
class Workload:
    """What every stream sends: a prompt of `input_len` words and exactly `output_len` generated tokens."""

    base_url: str
    model: str
    input_len: int
    output_len: int


async def _scrape(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    async with session.get(base_url.rstrip("/") + "/metrics") as response:
        response.raise_for_status()
        return parse_samples(await response.text())


async def _stream(
    session: aiohttp.ClientSession, workload: Workload, prompt: str, on_first_token: Callable[[], None]
) -> None:
    payload = {
        "model": workload.model,
        "prompt": prompt,
        "max_tokens": workload.output_len,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    started = False
    async with session.post(workload.base_url.rstrip("/") + "/v1/completions", json=payload) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for raw_line in response.content:
            line = raw_line.decode("utf-8").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if "error" in json.loads(line[len("data:") :]):
                raise RuntimeError(f"server error in stream: {line[:300]}")
            if not started:
                started = True
                on_first_token()


def _prompt(seed: int, words: int) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=words))


async def measure_batch(session: aiohttp.ClientSession, workload: Workload, batch: int, seed: int) -> StepBreakdown:
    """Starts `batch` streams; the window runs from the last first token (every prefill done) to the last token."""
    pending = batch
    all_started = asyncio.Event()

    def first_token() -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            all_started.set()

    streams = asyncio.gather(
        *(_stream(session, workload, _prompt(seed + i, workload.input_len), first_token) for i in range(batch))
    )
    waiter = asyncio.ensure_future(all_started.wait())
    racing: list[asyncio.Future[Any]] = [waiter, streams]
    await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    if streams.done() and not all_started.is_set():
        waiter.cancel()
        await streams
        raise RuntimeError("the streams ended before every one produced a token")
    before = await _scrape(session, workload.base_url)
    start = time.perf_counter()
    await streams
    window_s = time.perf_counter() - start
    after = await _scrape(session, workload.base_url)
    return step_breakdown(before, after, window_s, batch)


async def measure(
    base_urls: dict[str, str], batch_sizes: list[int], input_len: int, output_len: int, rounds: int
) -> dict[str, list[StepBreakdown]]:
    """One warm-up request per server, then per batch size `rounds` windows on each server, the servers taking
    turns (and the first one alternating) so load that drifts during the run weighs on every server alike."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        workloads = {}
        for mode, base_url in base_urls.items():
            model = await discover_model(session, base_url)
            workloads[mode] = Workload(base_url, model, input_len, output_len)
            await _stream(session, Workload(base_url, model, input_len, 8), _prompt(0, input_len), lambda: None)
        rows: dict[str, list[StepBreakdown]] = {mode: [] for mode in base_urls}
        for index, batch in enumerate(batch_sizes):
            for round_index in range(rounds):
                order = list(base_urls) if round_index % 2 == 0 else list(reversed(base_urls))
                for mode in order:
                    seed = 1000 * (index + 1) + 100 * round_index
                    rows[mode].append(await measure_batch(session, workloads[mode], batch, seed=seed))
                    print(f"{mode}, batch {batch}: {rows[mode][-1].steps} decode steps measured", flush=True)
        return rows


def _load_average() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--base-url", default=None, help="measure this running Tandem instead of starting one")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--input-len", type=int, default=32, help="prompt words (about one token each)")
    parser.add_argument("--output-len", type=int, default=64, help="tokens each stream generates (ignore_eos)")
    parser.add_argument("--kv-cache-memory", default="2GiB", help="passed to the launcher")
    parser.add_argument("--output", type=Path, default=None, help="write the rows as JSON")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    parser.add_argument("--rounds", type=int, default=2, help="windows per batch size and server")
    parser.add_argument(
        "--scheduling",
        choices=("both", "async", "sync"),
        default="both",
        help="start Tandem with --async-scheduling true, false, or both side by side and compare (default)",
    )
    return parser


def _run(args: argparse.Namespace) -> dict[str, list[StepBreakdown]]:
    """Rows per scheduling mode ("given" for a server started elsewhere)."""

    def go(base_urls: dict[str, str]) -> dict[str, list[StepBreakdown]]:
        return asyncio.run(measure(base_urls, args.batch_sizes, args.input_len, args.output_len, args.rounds))

    if args.base_url:
        return go({"given": args.base_url})
    modes = ("sync", "async") if args.scheduling == "both" else (args.scheduling,)
    with contextlib.ExitStack() as servers:
        base_urls = {}
        for mode in modes:
            launcher_args = [
                *("--max-batch-size", str(max(args.batch_sizes)), "--kv-cache-memory", args.kv_cache_memory),
                *("--async-scheduling", "true" if mode == "async" else "false"),
            ]
            log = args.log_dir / f"overhead-{mode}-launcher.log"
            tandem = servers.enter_context(LaunchedTandem(log, launcher_args))
            print(f"Tandem ({mode} scheduling) is up at {tandem.base_url}", flush=True)
            base_urls[mode] = tandem.base_url
        return go(base_urls)


def format_comparison(sync_rows: list[StepBreakdown], async_rows: list[StepBreakdown]) -> str:
    """Per batch size, means over its windows: the forward gap, the gap beyond the previous step's sampling (what
    scheduling can hide) and the decode rate, with asynchronous scheduling against without."""
    lines = [
        "| batch | gap sync ms | gap async ms | gap ratio | gap beyond sampling ratio | tok/s sync | tok/s async "
        "| tok/s ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for batch in dict.fromkeys(row.requested_batch for row in sync_rows):
        sync = _means([row for row in sync_rows if row.requested_batch == batch])
        overlapped = _means([row for row in async_rows if row.requested_batch == batch])
        lines.append(
            f"| {batch} | {sync[0]:.2f} | {overlapped[0]:.2f} | {_ratio(overlapped[0], sync[0])} | "
            f"{_ratio(overlapped[1], sync[1])} | {sync[2]:.1f} | {overlapped[2]:.1f} | "
            f"{_ratio(overlapped[2], sync[2])} |"
        )
    return "\n".join(lines)


def _means(rows: list[StepBreakdown]) -> tuple[float, float, float]:
    """Mean forward gap, gap beyond sampling, and decode tok/s."""
    count = len(rows)
    gap = sum(row.forward_gap_ms for row in rows) / count
    beyond = sum(row.forward_gap_ms - row.sampling_ms for row in rows) / count
    return gap, beyond, sum(row.tokens_per_s for row in rows) / count


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline else "n/a"


def main(argv: list[str]) -> int:
    """Measures every batch size and prints the table; 2 when the server cannot be started or reached."""
    args = build_parser().parse_args(argv)
    when = datetime.now(timezone.utc)
    load_before = _load_average()
    try:
        results = _run(args)
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    print(
        f"\nMeasured {when:%Y-%m-%d %H:%M} UTC with `{shlex.join([*COMMAND.split(), *argv])}`, {os.cpu_count()} CPU "
        f"cores (load average {load_before} before, {_load_average()} after; the machine may be shared). "
        "Per-step means in ms over decode steps only.\n"
    )
    for mode, rows in results.items():
        print(f"{mode} scheduling:\n\n{format_table(rows)}\n")
    if "sync" in results and "async" in results:
        print(format_comparison(results["sync"], results["async"]))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        document = {mode: [row.to_dict() for row in rows] for mode, rows in results.items()}
        args.output.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0
