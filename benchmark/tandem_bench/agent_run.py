"""`tandem-bench agent`: agent sessions that outgrow the KV cache, with and without KV offload.

Each session opens with the same long system prompt and a long context of its own (the files an agent read), then
asks short follow-ups; every turn re-sends the whole history. Turns go round-robin over the sessions, one request at
a time, so between two turns of a session every other session's history passes through a KV cache too small to hold
them all. Tandem is started twice with the same flags: once as they are, once with `--kv-offload-memory`. Without
offload a session's evicted history is computed again at its next turn; with it, the history is loaded back. The
figures are the median time to first token of the follow-up turns and the prompt tokens served from cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tandem_bench.client import Endpoint, RequestResult, stream_request
from tandem_bench.datasets import random_text
from tandem_bench.prometheus import parse_samples, total
from tandem_bench.server_process import LaunchedTandem

COMMAND = "tandem-bench agent"


@dataclass(frozen=True)
class Session:
    """One agent session: the shared system prompt, its own context, then `follow_ups`."""

    system: str
    context: str
    follow_ups: tuple[str, ...]


def build_sessions(args: argparse.Namespace) -> list[Session]:
    """The sessions of `args`; the same seed, the same words."""
    rng = random.Random(args.seed)
    system = f"You are a coding agent. Follow these rules: {random_text(rng, args.system_words)}"
    return [
        Session(
            system,
            f"Here are the files you read: {random_text(rng, args.context_words)}",
            tuple(f"Next step: {random_text(rng, args.follow_up_words)}" for _ in range(args.turns - 1)),
        )
        for _ in range(args.sessions)
    ]


@dataclass(frozen=True)
class AgentFigures:
    """One server's turns: the first turn of every session, then the follow-ups."""

    name: str
    first_turns: list[RequestResult]
    follow_ups: list[RequestResult]
    offload_loaded_blocks: float

    @staticmethod
    def _median_ms(results: list[RequestResult]) -> float:
        values = [result.ttft for result in results if result.success]
        return 1000 * statistics.median(values) if values else 0.0

    @property
    def follow_up_ttft_ms(self) -> float:
        return self._median_ms(self.follow_ups)

    @property
    def cached_share(self) -> float:
        """Prompt tokens of the follow-ups served from cache, over all their prompt tokens."""
        prompt = sum(result.prompt_tokens or 0 for result in self.follow_ups if result.success)
        cached = sum(result.cached_tokens or 0 for result in self.follow_ups if result.success)
        return cached / prompt if prompt else 0.0

    @property
    def failed(self) -> int:
        return sum(not result.success for result in self.first_turns + self.follow_ups)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.name,
            "first_turn_ttft_ms": self._median_ms(self.first_turns),
            "follow_up_ttft_ms": self.follow_up_ttft_ms,
            "follow_up_cached_share": self.cached_share,
            "offload_loaded_blocks": self.offload_loaded_blocks,
            "failed": self.failed,
        }


async def run_sessions(base_url: str, sessions: list[Session], args: argparse.Namespace) -> list[list[RequestResult]]:
    """Round-robin over the sessions, one request at a time; each session's results in turn order."""
    endpoint = Endpoint("agent", base_url, api="chat", extra_body={"ignore_eos": True})
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": session.system}, {"role": "user", "content": session.context}]
        for session in sessions
    ]
    results: list[list[RequestResult]] = [[] for _ in sessions]
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        for turn in range(args.turns):
            for index, session in enumerate(sessions):
                history = histories[index]
                if turn > 0:
                    history.append({"role": "user", "content": session.follow_ups[turn - 1]})
                result = await stream_request(client, endpoint, list(history), args.output_len)
                results[index].append(result)
                history.append({"role": "assistant", "content": result.text})
    return results


def measure(name: str, flags: list[str], sessions: list[Session], args: argparse.Namespace) -> AgentFigures:
    with LaunchedTandem(args.log_dir / f"tandem-{name}.log", flags) as server:
        results = asyncio.run(run_sessions(server.base_url, sessions, args))
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
            samples = parse_samples(response.read().decode())
        loaded = total(samples, "tandem_kv_offload_loaded_blocks_total")
    return AgentFigures(
        name,
        [session[0] for session in results],
        [result for session in results for result in session[1:]],
        loaded,
    )


def format_figures(figures: list[AgentFigures], args: argparse.Namespace) -> str:
    lines = [
        f"{args.sessions} sessions x {args.turns} turns, round-robin; system prompt {args.system_words} words, "
        f"context {args.context_words} words, follow-ups {args.follow_up_words} words, {args.output_len} tokens out; "
        f"--kv-cache-memory {args.kv_cache_memory}",
        "| server | first turn TTFT (median ms) | follow-up TTFT (median ms) | follow-up prompt tokens from cache "
        "| blocks loaded from the tiers | failed |",
        "|---|---|---|---|---|---|",
    ]
    for figure in figures:
        summary = figure.to_dict()
        lines.append(
            f"| {figure.name} | {summary['first_turn_ttft_ms']:.0f} | {figure.follow_up_ttft_ms:.0f} | "
            f"{100 * figure.cached_share:.0f}% | {figure.offload_loaded_blocks:.0f} | {figure.failed} |"
        )
    if len(figures) == 2 and figures[1].follow_up_ttft_ms:
        ratio = figures[0].follow_up_ttft_ms / figures[1].follow_up_ttft_ms
        lines.append(f"follow-up TTFT without offload / with offload: {ratio:.2f}x")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--sessions", type=int, default=8, help="agent sessions, more than the KV cache holds")
    parser.add_argument("--turns", type=int, default=4, help="turns per session (the first one and follow-ups)")
    parser.add_argument("--system-words", type=int, default=300, help="words of the shared system prompt")
    parser.add_argument("--context-words", type=int, default=900, help="words of each session's own context")
    parser.add_argument("--follow-up-words", type=int, default=30, help="words of each follow-up")
    parser.add_argument("--output-len", type=int, default=32, help="tokens each turn generates")
    parser.add_argument("--kv-cache-memory", default="96MiB", help="the servers' KV cache, too small for all")
    parser.add_argument("--kv-offload-memory", default="2GiB", help="the host tier of the offload run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one request may take")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags for both runs (one string)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "agent")
    parser.add_argument("--output", type=Path, default=None, help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    sessions = build_sessions(args)
    common = ["--kv-cache-memory", args.kv_cache_memory, *args.launcher_args.split()]
    figures = [
        measure("no-offload", common, sessions, args),
        measure("offload", [*common, "--kv-offload-memory", args.kv_offload_memory], sessions, args),
    ]
    print(format_figures(figures, args))
    if args.output is not None:
        args.output.write_text(json.dumps([figure.to_dict() for figure in figures], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
