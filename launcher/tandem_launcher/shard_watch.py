"""Notices a shard that is alive but stopped answering `Health` (hung), from a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tandem_launcher.readiness import shard_answers_health

Probe = Callable[[Path, float], bool]


class ShardHealthWatch:
    """Probes every shard's socket; a shard that has not answered for `timeout` seconds is reported."""

    def __init__(self, uds_paths: Sequence[Path], timeout: float, probe: Probe = shard_answers_health) -> None:
        self._uds_paths = list(uds_paths)
        self._timeout = timeout
        self._interval = max(0.2, timeout / 4)
        self._probe = probe
        self._stop = threading.Event()
        self._problem: str | None = None
        self._thread = threading.Thread(target=self._run, name="shard-health", daemon=True)

    def start(self) -> ShardHealthWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout + 1.0)

    def problem(self) -> str | None:
        """Why the group must restart, once a shard stopped answering; None while all answer."""
        return self._problem

    def _run(self) -> None:
        last_answer = [time.monotonic()] * len(self._uds_paths)
        while not self._stop.wait(self._interval):
            for rank, uds_path in enumerate(self._uds_paths):
                now = time.monotonic()
                if self._probe(uds_path, min(self._interval, 5.0)):
                    last_answer[rank] = now
                elif now - last_answer[rank] >= self._timeout and not self._stop.is_set():
                    self._problem = f"shard-{rank} has not answered Health for {self._timeout:g}s"
                    return
