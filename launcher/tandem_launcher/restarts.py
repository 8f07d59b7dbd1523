"""The restart policy: exponential backoff, at most `max_restarts` restarts within a sliding window."""

from __future__ import annotations

from collections import deque

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0


class RestartBudgetSpentError(Exception):
    """The shard group failed more often than `--max-restarts` allows within `--restart-window`."""

    def __init__(self, failure: str, max_restarts: int, window: float) -> None:
        super().__init__(
            f"{failure}\ngiving up: {max_restarts} restart(s) within {window:g}s already used (--max-restarts)"
        )


class RestartBudget:
    """Restart i (counted within the window) waits FIRST_DELAY_S * 2**i, capped at MAX_DELAY_S."""

    def __init__(self, max_restarts: int, window: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._restarts: deque[float] = deque()

    def next_delay(self, now: float) -> float | None:
        """Records a restart at `now` and returns its backoff, or None when the budget is spent."""
        while self._restarts and self._restarts[0] <= now - self.window:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = min(FIRST_DELAY_S * 2 ** len(self._restarts), MAX_DELAY_S)
        self._restarts.append(now)
        return delay

    def used(self) -> int:
        """Restarts recorded within the current window (as of the last `next_delay`)."""
        return len(self._restarts)
