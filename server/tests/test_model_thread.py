"""The model thread: with overlapping steps a staged job completes after the next staged job's launch when that one is
already queued (else right after its own launch), plain jobs run after every completion, a job whose caller cancelled
its future neither stops the worker nor is lost, and a job past the stall limit reads as stalled unless it is exempt
(Warmup)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from tandem_server.errors import ModelThreadStalledError
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


@pytest.mark.parametrize(
    ("overlap_steps", "order"),
    [
        (True, ["launch 1", "launch 2", "complete 1", "complete 2"]),
        # The CPU: step 1's tokens leave as soon as it ran, not after step 2 has run too.
        (False, ["launch 1", "complete 1", "launch 2", "complete 2"]),
    ],
)
def test_a_queued_staged_job_launches_before_the_one_ahead_completes_only_when_steps_overlap(
    overlap_steps: bool, order: list[str]
) -> None:
    events: list[str] = []

    async def scenario() -> list[str]:
        thread = ModelThread(stall_after_s=None, overlap_steps=overlap_steps)
        hold = threading.Event()
        first = thread.submit_staged(staged(events, "1", hold))
        second = thread.submit_staged(staged(events, "2"))
        hold.set()
        results = [await thread.result(first), await thread.result(second)]
        thread.shut_down()
        return results

    assert asyncio.run(scenario()) == ["1", "2"]
    assert events == order


def test_a_staged_job_alone_completes_at_once_and_plain_jobs_wait_for_completions() -> None:
    events: list[str] = []

    async def scenario() -> None:
        thread = ModelThread(stall_after_s=None, overlap_steps=True)
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


def test_a_job_past_the_stall_limit_reads_as_stalled_unless_exempt_like_warmup() -> None:
    stall_after_s = 0.02

    async def busy_for_longer_than_the_limit(thread: ModelThread, stall_limited: bool) -> str:
        started, hold = threading.Event(), threading.Event()

        def job() -> None:
            started.set()
            hold.wait(timeout=10)

        submitted = thread.submit(job, stall_limited=stall_limited)
        assert await asyncio.to_thread(started.wait, 10)
        await asyncio.sleep(stall_after_s * 3)
        try:
            thread.check_not_stalled()
            verdict = "healthy"
        except ModelThreadStalledError:
            verdict = "stalled"
        hold.set()
        await thread.result(submitted)
        return verdict

    async def scenario() -> tuple[str, str]:
        thread = ModelThread(stall_after_s=stall_after_s)
        step_like = await busy_for_longer_than_the_limit(thread, stall_limited=True)
        warmup_like = await busy_for_longer_than_the_limit(thread, stall_limited=False)
        thread.shut_down()
        return step_like, warmup_like

    assert asyncio.run(scenario()) == ("stalled", "healthy")
