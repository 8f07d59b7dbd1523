"""`tandem-bench kv-memory`: the shards' resident memory idle and at its peak while concurrent long, distinct prompts
fill the whole KV cache (the prefix cache keeps finished prompts' blocks, so the cache ends full) and their decode
steps run over long contexts. RSS is summed over the shards' process tree and sampled every `--sample-interval`."""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tandem_bench.kv_memory import FillPlan, KvMemoryReport, format_report, plan_fill
from tandem_bench.prometheus import parse_samples
from tandem_bench.run_output import print_and_save
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.soak_run import tree_rss
from tandem_bench.words import WORDS

COMMAND = "tandem-bench kv-memory"
KV_USAGE = "tandem_kv_cache_usage_ratio"
CALIBRATION_WORDS = 1000


@dataclass(frozen=True)
class KvMemoryConfig:
    base_url: str
    server_pid: int
    concurrency: int
    output_len: int
    fill: float
    sample_interval_s: float
    prompt_tokens: int = 0


def prompt_text(seed: int, words: int) -> str:
    """Random common words, different from the first token on for each seed, so no two prompts share a block."""
    return f"{seed}: " + " ".join(random.Random(seed).choices(WORDS, k=words))


def shards_rss(server_pid: int) -> int:
    return tree_rss(server_pid).get("shards", 0)


async def _json(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with session.request(method, url, json=body) as response:
        response.raise_for_status()
        return await response.json()


async def tokens_per_word(session: aiohttp.ClientSession, base_url: str) -> float:
    tokens = await _json(session, "POST", f"{base_url}/tokenize", {"inputs": prompt_text(0, CALIBRATION_WORDS)})
    return len(tokens) / CALIBRATION_WORDS


class _Sampler:
    """Samples the shards' RSS and the router's KV usage until stopped, keeping the peaks."""

    def __init__(self, session: aiohttp.ClientSession, config: KvMemoryConfig) -> None:
        self.session, self.config = session, config
        self.peak_rss = shards_rss(config.server_pid)
        self.peak_kv_usage = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak_rss = max(self.peak_rss, shards_rss(self.config.server_pid))
            async with self.session.get(f"{self.config.base_url}/metrics") as response:
                usage = parse_samples(await response.text()).get(KV_USAGE, 0.0)
            self.peak_kv_usage = max(self.peak_kv_usage, usage)
            await asyncio.sleep(self.config.sample_interval_s)


async def _fill(session: aiohttp.ClientSession, config: KvMemoryConfig, plan: FillPlan, words: int) -> list[int]:
    """Sends the plan's prompts, `concurrency` at once; the prompt tokens of each answer, -1 for a failure."""
    gate = asyncio.Semaphore(plan.concurrency)
    body = {"model": "", "max_tokens": plan.output_len, "temperature": 0.0, "ignore_eos": True}

    async def one(seed: int) -> int:
        async with gate:
            try:
                answer = await _json(
                    session, "POST", f"{config.base_url}/v1/completions", {**body, "prompt": prompt_text(seed, words)}
                )
            except aiohttp.ClientError:
                return -1
            return int(answer["usage"]["prompt_tokens"])

    return await asyncio.gather(*(one(seed) for seed in range(1, plan.requests + 1)))


async def measure(config: KvMemoryConfig) -> KvMemoryReport:
    """Idle RSS, then the fill under the sampler, then RSS once the load is gone."""
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        info = await _json(session, "GET", f"{config.base_url}/info")
        plan = plan_fill(
            info["kv_cache_tokens"],
            info["max_input_tokens"],
            config.concurrency,
            config.output_len,
            config.fill,
            config.prompt_tokens,
        )
        words = int(plan.prompt_tokens / await tokens_per_word(session, config.base_url))
        idle = shards_rss(config.server_pid)
        sampler, stop = _Sampler(session, config), asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        started = time.monotonic()
        sent = await _fill(session, config, plan, words)
        seconds = time.monotonic() - started
        stop.set()
        await sampling
        await asyncio.sleep(1.0)
        return KvMemoryReport(
            idle_rss=idle,
            peak_rss=max(sampler.peak_rss, shards_rss(config.server_pid)),
            after_rss=shards_rss(config.server_pid),
            kv_cache_tokens=info["kv_cache_tokens"],
            kv_cache_bytes=info["kv_cache_tokens"] * info.get("kv_cache_bytes_per_token", 0),
            plan=plan,
            prompt_tokens_sent=sum(tokens for tokens in sent if tokens > 0),
            failed=sum(1 for tokens in sent if tokens < 0),
            peak_kv_usage=sampler.peak_kv_usage,
            seconds=seconds,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--base-url", default=None, help="measure this running server instead of starting Tandem")
    parser.add_argument("--server-pid", type=int, default=None, help="with --base-url: the launcher's process id")
    parser.add_argument("--launcher-args", default="", help="flags for the launcher when starting Tandem")
    parser.add_argument("--concurrency", type=int, default=8, help="prompts in flight at once")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="tokens per prompt; 0: near --max-input-tokens")
    parser.add_argument("--output-len", type=int, default=64, help="tokens each prompt generates (ignore_eos)")
    parser.add_argument("--fill", type=float, default=1.25, help="prompt and output tokens sent, times the cache")
    parser.add_argument("--sample-interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--output", type=Path, default=None, help="write the measurements as JSON")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    return parser


def _config(args: argparse.Namespace, base_url: str, server_pid: int) -> KvMemoryConfig:
    return KvMemoryConfig(
        base_url, server_pid, args.concurrency, args.output_len, args.fill, args.sample_interval, args.prompt_tokens
    )


def _run(args: argparse.Namespace) -> KvMemoryReport:
    if args.base_url:
        if args.server_pid is None:
            raise ValueError("--base-url needs --server-pid, the process whose tree holds the shards")
        return asyncio.run(measure(_config(args, args.base_url, args.server_pid)))
    launcher_args = shlex.split(args.launcher_args)
    with LaunchedTandem(args.log_dir / "kv-memory-launcher.log", launcher_args) as tandem:
        print(f"Tandem is up at {tandem.base_url}", flush=True)
        if tandem.process is None:
            raise RuntimeError("Tandem did not start")
        return asyncio.run(measure(_config(args, tandem.base_url, tandem.process.pid)))


def main(argv: list[str]) -> int:
    """Fills the cache, prints the table; 2 when the server is unusable."""
    args = build_parser().parse_args(argv)
    try:
        report = _run(args)
    except (RuntimeError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 2
    print_and_save(COMMAND, argv, format_report(report), report.to_dict(), args.output)
    return 0
