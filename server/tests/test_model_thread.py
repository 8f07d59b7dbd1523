"""The model thread: a staged job completes after the next staged job's launch when that one is already queued, plain
jobs run after every completion, and a job whose caller cancelled its future neither stops the worker nor is lost."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from tandem_server.rpc.model_thread import ModelThread


def staged(events: list[str], name: str, hold: threading.Event | None = None) -> Callable[[], Callable[[], str]]:
    def launch() -> Callable[[], str]:
        if hold is not None:
            hold.wait(timeout=10)
        events.append(f"launch {name}")

        def complete() -> str:
            events.append(f"complete {name}")
            return name

        return complete

    return launch


def test_a_queued_staged_job_launches_before_the_one_ahead_completes() -> None:
    events: list[str] = []

    async def scenario() -> list[str]:
        thread = ModelThread(stall_after_s=None)
        hold = threading.Event()
        first = thread.submit_staged(staged(events, "1", hold))
        second = thread.submit_staged(staged(events, "2"))
        hold.set()
        results = [await thread.result(first), await thread.result(second)]
        thread.shut_down()
        return results

    assert asyncio.run(scenario()) == ["1", "2"]
    assert events == ["launch 1", "launch 2", "complete 1", "complete 2"]


def test_a_staged_job_alone_completes_at_once_and_plain_jobs_wait_for_completions() -> None:
    events: list[str] = []

    async def scenario() -> None:
        thread = ModelThread(stall_after_s=None)
        assert await thread.result(thread.submit_staged(staged(events, "1"))) == "1"
        hold = threading.Event()
        launched = thread.submit_staged(staged(events, "2", hold))
        plain = thread.submit(lambda: events.append("plain"))
        hold.set()
        await thread.result(launched)
        await thread.result(plain)
        thread.shut_down()

    asyncio.run(scenario())
    assert events == ["launch 1", "complete 1", "launch 2", "complete 2", "plain"]


def test_a_cancelled_future_leaves_its_job_run_and_the_worker_serving() -> None:
    events: list[str] = []

    async def scenario() -> str:
        thread = ModelThread(stall_after_s=None)
        hold = threading.Event()
        busy = thread.submit(lambda: hold.wait(timeout=10))
        cancelled = thread.submit_staged(staged(events, "cancelled"))
        cancelled.cancel()
        hold.set()
        await thread.result(busy)
        answer = await asyncio.wait_for(thread.run(lambda: "still serving"), timeout=10)
        thread.shut_down()
        return answer

    assert asyncio.run(scenario()) == "still serving"
    assert events == ["launch cancelled", "complete cancelled"]
