"""Turns SIGINT/SIGTERM into an orderly shutdown request, and a second one into an abort."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How often a wait on the shutdown flag looks at it.
_FLAG_POLL_S = 0.02


class ShutdownFlag:
    """A shutdown request, set by a signal handler and waited on by the supervisor.

    A signal handler runs in the main thread between two of its bytecodes, possibly while that thread holds a lock.
    `threading.Event.set` takes the Event's lock: a second SIGTERM landing inside the first one's `set` (as when a
    process manager and `pkill` both signal the launcher) waited forever on that lock, and the launcher left its
    children running. Setting this flag is one store; waiting on it polls.
    """

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether the flag is set, after at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _FLAG_POLL_S))
        return self._set


class ShutdownRequested(Exception):
    """A shutdown signal arrived before the launcher was serving."""

    def __init__(self, signum: int | None = None) -> None:
        super().__init__("shutdown requested" if signum is None else f"received {signal.Signals(signum).name}")


class AbortRequested(Exception):
    """A second shutdown signal: kill every child at once instead of draining."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received a second {signal.Signals(signum).name}")


def _raise_shutdown(signum: int, _frame: FrameType | None) -> None:
    raise ShutdownRequested(signum)


def raise_on_shutdown_signal() -> None:
    """Until children exist, a shutdown signal interrupts whatever runs (e.g. a model conversion)."""
    for signum in SHUTDOWN_SIGNALS:
        signal.signal(signum, _raise_shutdown)


def flag_on_shutdown_signal(requested: ShutdownFlag) -> None:
    """Once children exist, the first shutdown signal sets `requested` (the supervisor stops them in
    order); a second one raises AbortRequested in the main thread, wherever it is."""

    def _flag(signum: int, _frame: FrameType | None) -> None:
        if requested.is_set():
            raise AbortRequested(signum)
        requested.set()

    for signum in SHUTDOWN_SIGNALS:
        signal.signal(signum, _flag)


def forward_hangup(reload: Callable[[], None]) -> None:
    """SIGHUP calls `reload` (the router rereads its API key files) instead of ending the launcher."""
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reload())
