"""Per-phase step timings that never add a host sync: CUDA events read after the step's one transfer."""

from __future__ import annotations

import itertools
import time

import torch


class StepTimer:
    """Marks phase boundaries; on CUDA they are events on the current stream, on CPU wall-clock readings."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._cuda = device.type == "cuda"
        self._marks: list[torch.cuda.Event | float] = []
        self.mark()

    def mark(self) -> None:
        """Ends the current phase and starts the next one."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self._device))
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def ms_since(self, earlier: StepTimer, earlier_mark: int, mark: int) -> float:
        """Milliseconds from `earlier`'s mark `earlier_mark` to this timer's mark `mark` (both already taken)."""
        start, end = earlier._marks[earlier_mark], self._marks[mark]
        if isinstance(start, float) and isinstance(end, float):
            return (end - start) * 1000.0
        assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
        end.synchronize()
        return start.elapsed_time(end)

    def phases_ms(self) -> list[float]:
        """Milliseconds between consecutive marks; waits for the last CUDA event, which the step's result
        transfer has normally completed already."""
        if not self._cuda:
            seconds = [mark for mark in self._marks if isinstance(mark, float)]
            return [(end - start) * 1000.0 for start, end in itertools.pairwise(seconds)]
        # Invariant: a CUDA timer's marks are all events.
        events = [mark for mark in self._marks if isinstance(mark, torch.cuda.Event)]
        events[-1].synchronize()
        return [start.elapsed_time(end) for start, end in itertools.pairwise(events)]
