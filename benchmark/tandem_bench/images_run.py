"""`tandem-bench images`: time to first token of streamed chat requests that carry an image, with a fresh image in
every request against images repeated from a small pool, measured in the same invocation.

Works against any OpenAI-compatible server that accepts `image_url` parts with base64 `data:` URLs (`--base-url`), or
starts Tandem through its launcher on a vision-language checkpoint (`--model-id`). The images are PNGs drawn in this
process. After unmeasured warm-up requests (images of their own) and one request per pool image, `--rounds` rounds
each send a slice of the fresh requests and a slice of the pooled ones, closed loop at `--concurrency`, the order
reversed every round so drift in the machine's speed favours neither mode.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp

from tandem_bench.client import Endpoint, RequestResult, discover_model, extra_body, stream_request
from tandem_bench.cpu_features import cpu_features
from tandem_bench.images import (
    FRESH,
    IMAGE_KINDS,
    POOLED,
    ImageWorkload,
    build_requests,
    priming_requests,
    split_rounds,
    warmup_requests,
)
from tandem_bench.images_report import ImagesReport, ModeRun, format_report
from tandem_bench.run_output import print_and_save
from tandem_bench.server_process import LaunchedTandem

COMMAND = "tandem-bench images"
Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class LoadShape:
    """How the requests are sent: `concurrency` in flight, `rounds` alternating rounds, `warmup` unmeasured ones."""

    concurrency: int = 4
    rounds: int = 4
    warmup: int = 8
    timeout_s: float = 600.0


async def closed_loop(
    session: aiohttp.ClientSession, endpoint: Endpoint, requests: list[Messages], concurrency: int, max_tokens: int
) -> tuple[list[RequestResult], float]:
    """Sends `requests` in order with `concurrency` in flight; their results in sending order and the wall time."""
    results: list[RequestResult | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)
    start = time.perf_counter()

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            sent_at = time.perf_counter() - start
            result = await stream_request(session, endpoint, requests[index], max_tokens)
            result.start = sent_at
            results[index] = result

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    duration = time.perf_counter() - start
    return [result for result in results if result is not None], duration


async def _unmeasured(
    session: aiohttp.ClientSession, endpoint: Endpoint, requests: list[Messages], concurrency: int, max_tokens: int
) -> None:
    results, _ = await closed_loop(session, endpoint, requests, concurrency, max_tokens)
    for result in results:
        if not result.success:
            raise RuntimeError(f"an unmeasured request failed: {result.error}")


async def measure(endpoint: Endpoint, workload: ImageWorkload, load: LoadShape) -> ImagesReport:
    """Warms the server up, sends each pool image once, then runs both modes in alternating rounds."""
    fresh_rounds = split_rounds(build_requests(workload, FRESH), load.rounds)
    pooled_rounds = split_rounds(build_requests(workload, POOLED), load.rounds)
    fresh, pooled = ModeRun(FRESH), ModeRun(POOLED)
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    # limit=0: the pool never caps the concurrency under test; force_close: as in `load.run_load`.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        # At the measured concurrency, so the first batches of that size are not measured either.
        warmup = warmup_requests(workload, load.warmup)
        await _unmeasured(session, endpoint, warmup, load.concurrency, workload.output_len)
        await _unmeasured(session, endpoint, priming_requests(workload), load.concurrency, workload.output_len)
        for number in range(load.rounds):
            order = [(fresh, fresh_rounds[number]), (pooled, pooled_rounds[number])]
            if number % 2:
                order.reverse()
            for run, requests in order:
                results, duration = await closed_loop(
                    session, endpoint, requests, load.concurrency, workload.output_len
                )
                run.add_round(results, duration)
                done = f"{len(results)} requests in {duration:.1f}s"
                print(f"round {number + 1}/{load.rounds}, {run.mode}: {done}", flush=True)
    return ImagesReport(fresh, pooled)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    server = parser.add_mutually_exclusive_group(required=True)
    server.add_argument("--base-url", help="measure this running OpenAI-compatible server")
    server.add_argument("--model-id", help="start Tandem through its launcher serving this checkpoint")
    parser.add_argument("--launcher-args", default="", help="with --model-id: extra launcher flags (one string)")
    parser.add_argument("--model", default="", help="model name (default: the first id of /v1/models)")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    parser.add_argument("--extra-body", type=extra_body, default={}, help="JSON merged into every request")
    parser.add_argument("--requests", type=int, default=40, help="measured requests per mode")
    parser.add_argument("--pool-size", type=int, default=4, help="distinct images the pooled mode repeats")
    parser.add_argument("--image-size", type=int, nargs=2, default=[336, 336], metavar=("WIDTH", "HEIGHT"))
    parser.add_argument("--image-kind", choices=IMAGE_KINDS, default="noise", help="random pixels or one colour")
    parser.add_argument("--preamble-words", type=int, default=32, help="words of the text before the image")
    parser.add_argument("--question-words", type=int, default=8, help="words of the text after the image")
    parser.add_argument("--output-len", type=int, default=16, help="max_tokens of each request")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds the requests are split into")
    parser.add_argument("--warmup", type=int, default=8, help="unmeasured requests first, each with its own image")
    parser.add_argument("--seed", type=int, default=None, help="draws the images and texts (default: random)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument("--output", type=Path, default=None, help="write every measurement as JSON")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "images")
    return parser


def _workload(args: argparse.Namespace) -> ImageWorkload:
    return ImageWorkload(
        requests=args.requests,
        pool_size=args.pool_size,
        width=args.image_size[0],
        height=args.image_size[1],
        kind=args.image_kind,
        preamble_words=args.preamble_words,
        question_words=args.question_words,
        output_len=args.output_len,
        seed=secrets.randbits(31) if args.seed is None else args.seed,
    )


def _load(args: argparse.Namespace) -> LoadShape:
    return LoadShape(args.concurrency, args.rounds, args.warmup, args.timeout)


async def _measure_at(base_url: str, args: argparse.Namespace, workload: ImageWorkload) -> tuple[str, ImagesReport]:
    endpoint = Endpoint(
        name="images", base_url=base_url, api="chat", model=args.model, extra_body=args.extra_body, api_key=args.api_key
    )
    if not endpoint.model:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            endpoint = replace(endpoint, model=await discover_model(session, base_url, args.api_key))
    return endpoint.model, await measure(endpoint, workload, _load(args))


def _run(args: argparse.Namespace, workload: ImageWorkload) -> tuple[str, str, ImagesReport]:
    if args.base_url:
        return (args.base_url, *asyncio.run(_measure_at(args.base_url, args, workload)))
    flags = ["--model-id", args.model_id, *shlex.split(args.launcher_args)]
    with LaunchedTandem(args.log_dir / "launcher.log", flags) as tandem:
        print(f"Tandem is up at {tandem.base_url}", flush=True)
        return (tandem.base_url, *asyncio.run(_measure_at(tandem.base_url, args, workload)))


def main(argv: list[str]) -> int:
    """Runs both modes and prints the table; 1 when a measured request failed, 2 when the server is unusable."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.requests, args.concurrency, args.rounds) < 1 or args.requests < args.rounds:
        parser.error("--requests, --concurrency and --rounds must be at least 1, --rounds at most --requests")
    try:
        workload = _workload(args)
        started = datetime.now(timezone.utc)
        base_url, model, report = _run(args, workload)
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    cpu = cpu_features()
    heading = (
        f"{started:%Y-%m-%d %H:%M} UTC, {base_url}, model {model!r}, {workload.requests} requests per mode at "
        f"concurrency {args.concurrency} in {args.rounds} rounds, {workload.width}x{workload.height} {workload.kind} "
        f"PNGs, pool of {workload.pool_size}, seed {workload.seed}; client CPU: {cpu.describe()}\n"
    )
    results = {
        "date": started.isoformat(timespec="seconds"),
        "base_url": base_url,
        "model": model,
        "workload": asdict(workload),
        "load": asdict(_load(args)),
        "cpu": cpu.to_dict(),
        **report.to_dict(),
    }
    print_and_save(COMMAND, argv, heading + format_report(report), results, args.output)
    return 1 if report.failed else 0
