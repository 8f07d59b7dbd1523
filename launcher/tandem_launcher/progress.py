"""Download progress: one bar on a terminal; off a terminal (a pod's log), a line every few seconds with the bytes
done, the rate and the time left.

huggingface_hub reports through several tqdm-like objects (bytes received, bytes written, files done); this module
hands it a duck-typed class whose instances all feed one reporter, which counts the furthest byte counter."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tandem_launcher.hub_cache import format_bytes
from tandem_launcher.logs import LOGGER

LOG_INTERVAL_S = 10.0


class DownloadProgress:
    """Progress of one download of `total` bytes in `files` files."""

    def __init__(
        self,
        label: str,
        total: int,
        files: int,
        *,
        interval_s: float = LOG_INTERVAL_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.files = files
        self._stream = stream or sys.stderr
        # A bar on a terminal, log lines elsewhere (a pod's log, a file).
        self._interactive = _is_terminal(self._stream)
        self._interval_s = interval_s
        self._clock = clock
        self._log = log or (lambda line: LOGGER.info("%s", line))
        self._lock = threading.Lock()
        self.count_lock = threading.Lock()  # one bar is updated from every download thread
        self._byte_counters: list[_Bar] = []
        self._file_counters: list[_Bar] = []
        self._started = clock()
        self._closed = threading.Event()
        self._shown = 0
        self._bar: Any = None
        self._ticker: threading.Thread | None = None
        self.tqdm_class = self._bar_class()
        if total <= 0:
            return
        if self._interactive:
            from tqdm import tqdm  # noqa: PLC0415

            self._bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"downloading {label}",
                file=self._stream,
                dynamic_ncols=True,
            )
        else:
            self._ticker = threading.Thread(target=self._tick, name="download-progress", daemon=True)
            self._ticker.start()

    def _bar_class(self) -> type:
        progress = self

        class Bar(_Bar):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(progress, **kwargs)

        return Bar

    def register(self, bar: _Bar) -> None:
        with self._lock:
            (self._byte_counters if bar.counts_bytes else self._file_counters).append(bar)

    def changed(self) -> None:
        if self._bar is None:
            return
        with self._lock:
            done = min(self.done_bytes(), self.total)
            if done > self._shown:
                self._bar.update(done - self._shown)
                self._shown = done

    def done_bytes(self) -> int:
        """The furthest of the byte counters (received and written count the same bytes twice)."""
        return int(max((bar.n for bar in self._byte_counters), default=0))

    def done_files(self) -> int | None:
        return int(max(bar.n for bar in self._file_counters)) if self._file_counters else None

    def line(self) -> str:
        """`downloading org/model: 1.2 GiB of 3.4 GiB (35%), 80.1 MiB/s, 28s left, 2 of 5 files`."""
        elapsed = max(self._clock() - self._started, 1e-9)
        done = min(self.done_bytes(), self.total)
        rate = done / elapsed
        percent = 100.0 * done / self.total if self.total else 100.0
        left = f"{_duration((self.total - done) / rate)} left" if rate > 0 else "time left unknown"
        text = (
            f"downloading {self.label}: {format_bytes(done)} of {format_bytes(self.total)} ({percent:.0f}%), "
            f"{format_bytes(rate)}/s, {left}"
        )
        files = self.done_files()
        return text if files is None else f"{text}, {files} of {self.files} files"

    def _tick(self) -> None:
        while not self._closed.wait(self._interval_s):
            self._log(self.line())

    def close(self) -> None:
        """Ends the bar or the log lines with a summary of what was fetched."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)
        if self._bar is not None:
            self.changed()
            self._bar.close()
        if self.total > 0:
            elapsed = max(self._clock() - self._started, 1e-9)
            done = min(self.done_bytes(), self.total)
            self._log(
                f"downloaded {format_bytes(done)} of {self.label} in {_duration(elapsed)} "
                f"({format_bytes(done / elapsed)}/s)"
            )


class _Bar:
    """What huggingface_hub calls on a tqdm bar; every instance reports to one DownloadProgress."""

    def __init__(self, progress: DownloadProgress, **kwargs: Any) -> None:
        self._progress = progress
        self.total = kwargs.get("total")
        self.n = kwargs.get("initial") or 0
        self.desc = kwargs.get("desc", "")
        self.disable = False
        self.counts_bytes = kwargs.get("unit") == "B"
        progress.register(self)
        if self.n:
            progress.changed()

    def update(self, n: float | None = 1) -> bool:
        with self._progress.count_lock:
            self.n += n or 0
        self._progress.changed()
        return True

    @property
    def format_dict(self) -> dict[str, Any]:
        return {"n": self.n, "total": self.total, "rate": None, "elapsed": 0}

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def clear(self, *args: Any, **kwargs: Any) -> None:
        pass

    def reset(self, total: float | None = None) -> None:
        self.n = 0
        self.total = total

    def close(self) -> None:
        pass

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    """75 -> '1m15s'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
