"""Drives conversations at a server: closed loop (N in flight) or open loop (Poisson/gamma arrivals)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from tandem_bench.client import Endpoint, RequestResult, stream_request
from tandem_bench.datasets import Conversation

SKIPPED_ERROR = "skipped: an earlier turn of this conversation failed"


@dataclass(frozen=True)
class LoadPoint:
    """Closed loop keeps `concurrency` conversations in flight; open loop starts them at `request_rate` per second."""

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None

    @property
    def label(self) -> str:
        if self.request_rate is None:
            return f"concurrency={self.concurrency}"
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        return f"rate={rate}/s"


@dataclass
class RunOutcome:
    """Every request of one run and the wall time from the first send to the last answer."""

    results: list[RequestResult]
    duration: float


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Start times (s) with gamma inter-arrival gaps of mean 1/rate; burstiness 1 is Poisson, lower is burstier."""
    if math.isinf(rate):
        return [0.0] * count
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    # The first conversation starts at once; the gaps separate the ones after it.
    return [0.0, *np.cumsum(gaps[1:]).tolist()] if count else []


async def run_conversation(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    conversation: Conversation,
    run_start: float,
    record: Callable[[RequestResult], None],
) -> None:
    """Sends the turns in order; each later turn carries every earlier question and the server's answer."""
    messages: list[dict[str, str]] = []
    if conversation.system is not None:
        messages.append({"role": "system", "content": conversation.system})
    for index, turn in enumerate(conversation.turns):
        messages.append({"role": "user", "content": turn.text})
        sent_at = time.perf_counter() - run_start
        result = await stream_request(session, endpoint, list(messages), turn.output_len)
        result.start = sent_at
        record(result)
        if not result.success:
            for _ in conversation.turns[index + 1 :]:
                record(RequestResult(success=False, error=SKIPPED_ERROR, start=sent_at))
            return
        messages.append({"role": "assistant", "content": result.text})


async def _closed_loop(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    conversations: list[Conversation],
    concurrency: int,
    record: Callable[[RequestResult], None],
) -> None:
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conversation in conversations:
        queue.put_nowait(conversation)
    start = time.perf_counter()

    async def worker() -> None:
        while not queue.empty():
            await run_conversation(session, endpoint, queue.get_nowait(), start, record)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))


async def _open_loop(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    conversations: list[Conversation],
    point: LoadPoint,
    seed: int,
    record: Callable[[RequestResult], None],
) -> None:
    rate = math.inf if point.request_rate is None else point.request_rate
    offsets = arrival_offsets(len(conversations), rate, point.burstiness, seed)
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    start = time.perf_counter()

    async def launch(conversation: Conversation) -> None:
        if limit is None:
            await run_conversation(session, endpoint, conversation, start, record)
            return
        async with limit:
            await run_conversation(session, endpoint, conversation, start, record)

    tasks = []
    for conversation, offset in zip(conversations, offsets, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(launch(conversation)))
    await asyncio.gather(*tasks)


async def run_load(
    endpoint: Endpoint,
    conversations: list[Conversation],
    point: LoadPoint,
    seed: int,
    on_result: Callable[[RequestResult], None] | None = None,
    timeout_s: float = 600.0,
) -> RunOutcome:
    """Runs every conversation against `endpoint` under `point`; `on_result` sees each request as it ends."""
    results: list[RequestResult] = []

    def record(result: RequestResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    # limit=0: the connection pool must never cap the concurrency under test. force_close: one connection per
    # request, since a request written to a kept-alive connection the server has just closed fails through no fault
    # of the server (llama-server closes them); a loopback connect costs well under a millisecond.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        if point.request_rate is None:
            await _closed_loop(session, endpoint, conversations, point.concurrency or 1, record)
        else:
            await _open_loop(session, endpoint, conversations, point, seed, record)
        duration = time.perf_counter() - start
    return RunOutcome(results=results, duration=duration)
