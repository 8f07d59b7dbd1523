"""Turns SIGINT/SIGTERM into an orderly shutdown request, and a second one into an abort."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


def flag_on_shutdown_signal(requested: threading.Event) -> None:
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
