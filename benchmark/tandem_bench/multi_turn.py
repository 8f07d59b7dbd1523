"""Multi-turn chats that re-send their whole history each turn, timed turn by turn: what prefix reuse saves.

Every conversation opens with the same long system prompt; each turn appends a new user message to the system prompt,
every earlier user message and the server's earlier answers, and sends it all through `/v1/chat/completions`. The
time to first token of turn N then holds the prefill of whatever part of that history the server did not keep.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.datasets import Conversation, Turn, random_text
from tandem_bench.load import run_conversation


@dataclass(frozen=True)
class ChatShape:
    """`conversations` chats of `turns` turns each over one system prompt of `system_words` words; each user message
    has `user_words` words and each answer exactly `output_len` tokens."""

    conversations: int = 4
    turns: int = 5
    system_words: int = 600
    user_words: int = 40
    output_len: int = 32
    seed: int = 0


def build_conversations(shape: ChatShape) -> list[Conversation]:
    """The chats of `shape`: one shared system prompt, then distinct user messages; the same seed, the same words."""
    rng = random.Random(shape.seed)
    system = f"You are a careful assistant. Keep these notes in mind: {random_text(rng, shape.system_words)}"
    return [
        Conversation(
            system,
            tuple(
                Turn(random_text(rng, shape.user_words), shape.user_words, shape.output_len) for _ in range(shape.turns)
            ),
        )
        for _ in range(shape.conversations)
    ]


@dataclass(frozen=True)
class TurnTimings:
    """Each turn's time to first token (seconds) and prompt tokens, one entry per conversation that reached it."""

    ttft_s: list[list[float]]
    prompt_tokens: list[list[int]]
    failed: int

    @classmethod
    def from_conversations(cls, results: list[list[RequestResult]]) -> TurnTimings:
        """Groups each conversation's results (in turn order) by turn, leaving failed requests out."""
        turns = max((len(conversation) for conversation in results), default=0)
        ttft: list[list[float]] = [[] for _ in range(turns)]
        tokens: list[list[int]] = [[] for _ in range(turns)]
        failed = 0
        for conversation in results:
            for turn, result in enumerate(conversation):
                if not result.success:
                    failed += 1
                    continue
                ttft[turn].append(result.ttft)
                tokens[turn].append(result.prompt_tokens or 0)
        return cls(ttft, tokens, failed)

    @classmethod
    def merge(cls, runs: list[TurnTimings]) -> TurnTimings:
        """The timings of several runs of the same shape pooled turn by turn."""
        turns = max((len(run.ttft_s) for run in runs), default=0)
        return cls(
            [[value for run in runs if turn < len(run.ttft_s) for value in run.ttft_s[turn]] for turn in range(turns)],
            [
                [value for run in runs if turn < len(run.prompt_tokens) for value in run.prompt_tokens[turn]]
                for turn in range(turns)
            ],
            sum(run.failed for run in runs),
        )

    def median_ttft_ms(self) -> list[float]:
        """The median time to first token of each turn, in milliseconds (0 for a turn no request completed)."""
        return [1000 * statistics.median(values) if values else 0.0 for values in self.ttft_s]

    def mean_prompt_tokens(self) -> list[float]:
        return [statistics.fmean(values) if values else 0.0 for values in self.prompt_tokens]

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_ttft_ms": self.median_ttft_ms(),
            "mean_prompt_tokens": self.mean_prompt_tokens(),
            "ttft_s": self.ttft_s,
            "prompt_tokens": self.prompt_tokens,
            "failed": self.failed,
        }


def turn_ratios(cached: list[float], uncached: list[float]) -> list[float | None]:
    """Each turn's figure with the cache over its figure without (None where the uncached one is 0)."""
    return [on / off if off else None for on, off in zip(cached, uncached, strict=True)]


async def run_chats(endpoint: Endpoint, conversations: list[Conversation], timeout_s: float) -> TurnTimings:
    """Runs every conversation at once, each turn after the previous answer; returns their timings by turn."""
    results: list[list[RequestResult]] = [[] for _ in conversations]
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(
            *(
                run_conversation(session, endpoint, conversation, start, results[index].append)
                for index, conversation in enumerate(conversations)
            )
        )
    return TurnTimings.from_conversations(results)
