"""The worker thread that runs model work off the event loop, and whether its current job has stalled."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from tandem_server.errors import ModelThreadStalledError

Result = TypeVar("Result")
_CPU = torch.device("cpu")


@dataclass(frozen=True)
class _Job:
    run: Callable[[], Any]
    future: Future[Any]
    # A staged job's `run` launches work and returns the callable that completes it.
    staged: bool
    stall_limited: bool = True


class ModelThread:
    """Runs model jobs one at a time, in the order they were submitted, and remembers when the running job started.

    A job may be submitted while another runs: it starts the moment the worker is free, without a hop through the
    event loop. A staged job runs in two phases, launch and completion. With `overlap_steps` (an asynchronous device),
    when the next job is already queued the worker launches that job before it completes the one before, so the host
    prepares step N+1 while the device still runs step N. Without it (the CPU, where a launch runs the whole step)
    each job completes right after its launch: holding step N's tokens until step N+1 has run would only delay them,
    and deliver them in pairs. A plain job (Warmup, Reset, health probes) runs only after every staged job completed.

    A job outlives the RPC that asked for it when that RPC is cancelled (a thread cannot be interrupted), so the
    start time is set and cleared by the worker itself: while it is set, the model is busy whatever the RPCs say.
    A job busy for longer than `stall_after_s` means a wedged device; Health then fails, so the launcher restarts
    the shard group instead of the router waiting on it forever. A job run with `stall_limited=False` (Warmup, which
    compiles for minutes under --torch-compile) is exempt: the launcher's router start timeout bounds it.

    The CUDA current device is per thread, so the one worker is bound to the rank's device when it starts: every
    kernel launch, stream, event and memory probe a job makes without naming a device lands on the rank's GPU.
    """

    def __init__(self, stall_after_s: float | None, device: torch.device = _CPU, overlap_steps: bool = False) -> None:
        self._stall_after_s = stall_after_s
        self._overlap_steps = overlap_steps
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Set and cleared by the worker around each phase of a job.
        self._job_started: float | None = None
        self._job_stall_limited = True
        # The start of a running job whose caller gave up on it; cleared by the worker when that job ends.
        self._abandoned_since: float | None = None
        self._worker = threading.Thread(target=self._work, args=(device,), name="model", daemon=True)
        self._worker.start()

    def submit(self, job: Callable[[], Result], stall_limited: bool = True) -> asyncio.Future[Result]:
        """Queues `job()` behind the jobs already submitted; refused while an abandoned job occupies the model."""
        return asyncio.wrap_future(self._put(job, staged=False, stall_limited=stall_limited))

    def submit_staged(self, launch: Callable[[], Callable[[], Result]]) -> asyncio.Future[Result]:
        """Queues a two-phase job: `launch()` returns the callable whose result the future carries."""
        return asyncio.wrap_future(self._put(launch, staged=True))

    def _put(self, run: Callable[[], Any], staged: bool, stall_limited: bool = True) -> Future[Any]:
        abandoned = self._abandoned_since
        if abandoned is not None:
            raise ModelThreadStalledError(
                f"the model is still busy with a job started {time.monotonic() - abandoned:.1f}s ago "
                "whose caller gave up on it"
            )
        future: Future[Any] = Future()
        self._jobs.put(_Job(run, future, staged, stall_limited))
        return future

    async def result(self, submitted: asyncio.Future[Result]) -> Result:
        """Waits for a submitted job; a caller that gives up while a job runs leaves the model marked busy."""
        try:
            return await asyncio.shield(submitted)
        except asyncio.CancelledError:
            if self._job_started is not None:
                self._abandoned_since = self._job_started
            raise

    def call(self, job: Callable[[], Result]) -> Result:
        """`job()` on the worker thread, the caller blocked until it ends: for start-up, before any event loop runs."""
        result: Result = self._put(job, staged=False).result()
        return result

    async def run(self, job: Callable[[], Result], stall_limited: bool = True) -> Result:
        """`job()` on the worker thread, after every job submitted before it."""
        return await self.result(self.submit(job, stall_limited))

    def _work(self, device: torch.device) -> None:
        bind_thread_to_device(device)
        # A launched staged job whose completion waits for the next job's launch.
        open_job: tuple[Callable[[], Any], Future[Any]] | None = None
        while True:
            if open_job is not None and self._jobs.empty():
                self._execute(*open_job)
                open_job = None
            job = self._jobs.get()
            if job is None or not job.staged:
                if open_job is not None:
                    self._execute(*open_job)
                    open_job = None
                if job is None:
                    return
                self._execute(job.run, job.future, job.stall_limited)
                continue
            launched: Future[Callable[[], Any]] = Future()
            self._execute(job.run, launched)
            if open_job is not None:
                self._execute(*open_job)
            open_job = None
            failure = launched.exception()
            if failure is not None:
                if not job.future.cancelled():
                    job.future.set_exception(failure)
            elif self._overlap_steps:
                open_job = (launched.result(), job.future)
            else:
                self._execute(launched.result(), job.future)

    def _execute(self, run: Callable[[], Any], future: Future[Any], stall_limited: bool = True) -> None:
        # Every job runs, even one whose future was cancelled: a launched step must still complete.
        self._job_stall_limited = stall_limited
        self._job_started = time.monotonic()
        try:
            result = run()
        except BaseException as error:
            if not future.cancelled():
                future.set_exception(error)
        else:
            if not future.cancelled():
                future.set_result(result)
        finally:
            self._job_started = None
            self._abandoned_since = None

    def check_not_stalled(self) -> None:
        """Raises when the running job has been busy for longer than the stall limit."""
        started = self._job_started
        if started is None or self._stall_after_s is None or not self._job_stall_limited:
            return
        busy_s = time.monotonic() - started
        if busy_s > self._stall_after_s:
            raise ModelThreadStalledError(
                f"one model job has run for {busy_s:.0f}s, longer than --step-timeout {self._stall_after_s:g}s"
            )

    def shut_down(self) -> None:
        """Takes no more jobs; the worker ends after the jobs already queued."""
        self._jobs.put(None)


def bind_thread_to_device(device: torch.device) -> None:
    """Makes `device` the calling thread's current CUDA device (nothing to bind on the CPU)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
