"""The worker thread that runs model work off the event loop, and whether its current job has stalled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from tandem_server.errors import ModelThreadStalledError

Result = TypeVar("Result")
_CPU = torch.device("cpu")


class ModelThread:
    """Runs model jobs one at a time, in the order they were submitted, and remembers when the running job started.

    A job may be submitted while another runs: it starts the moment the worker is free, without a hop through the
    event loop. A job outlives the RPC that asked for it when that RPC is cancelled (a thread cannot be
    interrupted), so the start time is set and cleared by the worker itself: while it is set, the model is busy
    whatever the RPCs say. A job busy for longer than `stall_after_s` means a wedged device; Health then fails, so
    the launcher restarts the shard group instead of the router waiting on it forever.

    The CUDA current device is per thread, so the one worker is bound to the rank's device when it starts: every
    kernel launch, stream, event and memory probe a job makes without naming a device lands on the rank's GPU.
    """

    def __init__(self, stall_after_s: float | None, device: torch.device = _CPU) -> None:
        self._stall_after_s = stall_after_s
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="model", initializer=bind_thread_to_device, initargs=(device,)
        )
        # Set and cleared by the worker around each job.
        self._job_started: float | None = None
        # The start of a running job whose caller gave up on it; cleared by the worker when that job ends.
        self._abandoned_since: float | None = None

    def submit(self, job: Callable[[], Result]) -> asyncio.Future[Result]:
        """Queues `job()` behind the jobs already submitted; refused while an abandoned job occupies the model."""
        abandoned = self._abandoned_since
        if abandoned is not None:
            raise ModelThreadStalledError(
                f"the model is still busy with a job started {time.monotonic() - abandoned:.1f}s ago "
                "whose caller gave up on it"
            )
        return asyncio.get_running_loop().run_in_executor(self._executor, self._run_job, job)

    async def result(self, submitted: asyncio.Future[Result]) -> Result:
        """Waits for a submitted job; a caller that gives up while a job runs leaves the model marked busy."""
        try:
            return await submitted
        except asyncio.CancelledError:
            if self._job_started is not None:
                self._abandoned_since = self._job_started
            raise

    async def run(self, job: Callable[[], Result]) -> Result:
        """`job()` on the worker thread, after every job submitted before it."""
        return await self.result(self.submit(job))

    def _run_job(self, job: Callable[[], Result]) -> Result:
        self._job_started = time.monotonic()
        try:
            return job()
        finally:
            self._job_started = None
            self._abandoned_since = None

    def check_not_stalled(self) -> None:
        """Raises when the running job has been busy for longer than the stall limit."""
        started = self._job_started
        if started is None or self._stall_after_s is None:
            return
        busy_s = time.monotonic() - started
        if busy_s > self._stall_after_s:
            raise ModelThreadStalledError(
                f"one model job has run for {busy_s:.0f}s, longer than --step-timeout {self._stall_after_s:g}s"
            )

    def shut_down(self) -> None:
        self._executor.shutdown(wait=False)


def bind_thread_to_device(device: torch.device) -> None:
    """Makes `device` the calling thread's current CUDA device (nothing to bind on the CPU)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
