"""`tandem-bench fair`: one API key's burst against another key's steady trickle, under each scheduling policy.

For each policy (`fcfs`, then `fair`) Tandem is started with the embedded model, a key file of two keys of weight 1
and `--max-batch-size` small enough that the burst queues. Key B first sends its trickle alone: `--trickle`
requests, one every `--interval` seconds. Then key A sends `--burst` requests at once while key B sends the same
trickle. The figure is key B's median time to first token under the burst over its median alone: what one tenant's
burst costs another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tandem_bench.client import Endpoint, RequestResult, stream_request
from tandem_bench.server_process import LaunchedTandem

COMMAND = "tandem-bench fair"
POLICIES = ("fcfs", "fair")
KEY_A, KEY_B = "sk-bench-burst", "sk-bench-trickle"


@dataclass(frozen=True)
class PolicyFigures:
    """Key B's median time to first token (seconds) alone and under key A's burst, on one policy."""

    policy: str
    alone_s: float
    under_burst_s: float
    failed: int
    # Every successful request's time to first token under the burst, in order sent (seconds).
    under_burst_ttfts: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        return self.under_burst_s / self.alone_s if self.alone_s else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "ttft_alone_ms": 1000 * self.alone_s,
            "ttft_under_burst_ms": 1000 * self.under_burst_s,
            "ratio": self.ratio,
            "failed": self.failed,
            "ttfts_under_burst_ms": [round(1000 * ttft, 1) for ttft in self.under_burst_ttfts],
        }


def median_ttft(results: list[RequestResult]) -> float:
    """The median time to first token of the successful requests (0 when none succeeded)."""
    ttfts = [result.ttft for result in results if result.success]
    return statistics.median(ttfts) if ttfts else 0.0


def failures(results: list[RequestResult]) -> int:
    return sum(not result.success for result in results)


async def trickle(
    session: aiohttp.ClientSession, endpoint: Endpoint, count: int, interval_s: float, max_tokens: int
) -> list[RequestResult]:
    """`count` requests from `endpoint`'s key, one every `interval_s` seconds, each awaited in the background."""
    tasks = []
    for index in range(count):
        if index:
            await asyncio.sleep(interval_s)
        prompt = [{"role": "user", "content": f"Trickle request {index}: describe a river in one line."}]
        tasks.append(asyncio.create_task(stream_request(session, endpoint, prompt, max_tokens)))
    return list(await asyncio.gather(*tasks))


async def burst(session: aiohttp.ClientSession, endpoint: Endpoint, count: int, max_tokens: int) -> list[RequestResult]:
    """`count` requests from `endpoint`'s key at once."""
    prompts = [
        [{"role": "user", "content": f"Burst request {index}: write about mountains."}] for index in range(count)
    ]
    return list(await asyncio.gather(*(stream_request(session, endpoint, prompt, max_tokens) for prompt in prompts)))


async def measure_policy(base_url: str, policy: str, args: argparse.Namespace) -> PolicyFigures:
    """Key B alone, then under key A's burst, on the server at `base_url`."""
    extra = {"ignore_eos": True}
    trickler = Endpoint("trickle", base_url, api_key=KEY_B, extra_body=extra)
    burster = Endpoint("burst", base_url, api_key=KEY_A, extra_body=extra)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        alone = await trickle(session, trickler, args.trickle, args.interval, args.trickle_tokens)
        burst_task = asyncio.create_task(burst(session, burster, args.burst, args.burst_tokens))
        # The burst's requests are all queued before the trickle starts.
        await asyncio.sleep(args.interval)
        under = await trickle(session, trickler, args.trickle, args.interval, args.trickle_tokens)
        burst_results = await burst_task
    under_ttfts = tuple(result.ttft for result in under if result.success)
    return PolicyFigures(
        policy, median_ttft(alone), median_ttft(under), failures(alone + under + burst_results), under_ttfts
    )


def format_figures(figures: list[PolicyFigures], args: argparse.Namespace) -> str:
    lines = [
        f"key A: {args.burst} requests at once of {args.burst_tokens} tokens; key B: {args.trickle} requests of "
        f"{args.trickle_tokens} tokens, one every {args.interval:g} s; --max-batch-size {args.max_batch_size}",
        "| policy | B's TTFT alone (median ms) | B's TTFT under A's burst (median ms) | ratio | failed |",
        "|---|---|---|---|---|",
    ]
    for figure in figures:
        lines.append(
            f"| {figure.policy} | {1000 * figure.alone_s:.0f} | {1000 * figure.under_burst_s:.0f} | "
            f"{figure.ratio:.2f}x | {figure.failed} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--burst", type=int, default=64, help="key A's requests, sent at once")
    parser.add_argument("--burst-tokens", type=int, default=64, help="tokens each burst request generates")
    parser.add_argument("--trickle", type=int, default=8, help="key B's requests")
    parser.add_argument("--trickle-tokens", type=int, default=8, help="tokens each trickle request generates")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between key B's requests")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES), help="policies to measure")
    parser.add_argument("--max-batch-size", type=int, default=8, help="the servers' --max-batch-size")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one request may take")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags (one string)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "fair")
    parser.add_argument("--output", type=Path, default=None, help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    key_file = args.log_dir / "keys.txt"
    key_file.write_text(f"{KEY_A} name=burst\n{KEY_B} name=trickle\n")
    figures = []
    for policy in args.policies:
        flags = [
            "--api-key-file", str(key_file),
            "--scheduling-policy", policy,
            "--max-batch-size", str(args.max_batch_size),
            "--max-queue-time", str(int(args.timeout)),
            *args.launcher_args.split(),
        ]  # fmt: skip
        with LaunchedTandem(args.log_dir / f"tandem-{policy}.log", flags, api_key=KEY_B) as server:
            figures.append(asyncio.run(measure_policy(server.base_url, policy, args)))
    print(format_figures(figures, args))
    if args.output is not None:
        args.output.write_text(json.dumps([figure.to_dict() for figure in figures], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
