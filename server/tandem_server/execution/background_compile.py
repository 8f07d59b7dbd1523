"""Compilation beside serving: a thread that compiles while no step runs, and the gate steps hold it back with.

The shard's steps and a compile share one interpreter. A compile is hours of pure Python for Dynamo and Inductor,
and a thread that busy takes the interpreter lock from the model thread at every operator: measured on the embedded
model (2 cores, gguf weights), a decode step took 27.9 ms beside a busy Python thread against 8.3 ms alone. So the
compile thread pauses at its next Python call whenever a step runs (`StepGate`), and runs at the lowest CPU priority,
which the C++ compiler processes it starts inherit. The pause waits at most `_PAUSE_S` at a time: a lock the paused
thread holds (an import, a logging handler) can delay a step by that much, never deadlock it.

One part of a compile must not overlap a step at all: while `torch.fx` traces a graph (Inductor's passes do, many
times per compile) it patches `nn.Module.__call__` and `__getattr__` for every thread, and an eager step's module
calls would run through the tracer and fail. The compile thread's call hook sees each trace start: it waits for the
running step to end and holds new steps back until the trace returns (`StepGate.enter_trace`); traces take
milliseconds to a few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch

logger = logging.getLogger(__name__)

# The longest the compile thread waits for a step to end before it runs one more Python call.
_PAUSE_S = 0.05
# The function that patches `nn.Module.__call__` (and `__getattr__`) process-wide while it traces a graph.
_FX_TRACE = torch.fx.Tracer.trace.__code__
# The interpreter's switch interval while a compile runs: a step asking for the lock waits at most this long.
_SWITCH_INTERVAL_S = 0.0005


class StepGate:
    """Whether a step is running, and whether the compile thread is inside a torch.fx trace: never both at once.

    The model thread holds `step` for each step and the compile thread waits while it is held; the compile thread
    holds `trace` while torch.fx traces, which patches `nn.Module.__call__` for every thread (an eager step would
    run through the tracer and fail), and a step starting then waits for the trace to end.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        # Steps running now; read without the lock by the compile thread at each of its calls, which only needs to
        # see a step soon after it starts.
        self.depth = 0
        # torch.fx traces the compile thread is inside (they nest).
        self._traces = 0

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Held while a step (or Warmup, or a health check) runs on the model thread; re-entrant."""
        with self._changed:
            # Invariant: while a step runs no trace starts, so a nested step never waits here.
            self._changed.wait_for(lambda: self._traces == 0)
            self.depth += 1
        try:
            yield
        finally:
            with self._changed:
                self.depth -= 1
                self._changed.notify_all()

    def enter_trace(self, unless: Callable[[], bool]) -> bool:
        """Waits for the running step to end, then holds steps back until `exit_trace`; True once held. Gives up
        (False, nothing held) as soon as `unless()` holds: a step stopping the compile waits for it to end."""
        with self._changed:
            while self.depth and not unless():
                self._changed.wait(_PAUSE_S)
            if self.depth:
                return False
            self._traces += 1
            return True

    def exit_trace(self) -> None:
        with self._changed:
            self._traces -= 1
            self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for no step to run; True when none does."""
        with self._changed:
            return self._changed.wait_for(lambda: self.depth == 0, timeout)


class BackgroundCompile:
    """Runs `work` on a thread of its own that yields to every step `gate` holds; `error` holds what it raised."""

    def __init__(self, name: str, work: Callable[[Callable[[], bool]], None], gate: StepGate) -> None:
        self._work = work
        self._gate = gate
        self._stop = threading.Event()
        # `_stop` as a plain attribute, read at each of the thread's calls.
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Asks the work to stop at its next check, then waits for it. A graph being compiled finishes first, without
        pausing for the steps (the caller may be one, holding the gate)."""
        self._stopping = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the work to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        _lowest_priority()
        previous_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(previous_interval, _SWITCH_INTERVAL_S))
        sys.settrace(self._yield_to_steps)
        try:
            self._work(self._stop.is_set)
        except Exception as error:
            # The shard keeps serving eagerly; the error is logged and kept.
            self.error = error
            logger.warning("torch.compile in the background failed; steps keep running eagerly: %r", error)
        finally:
            sys.settrace(None)
            sys.setswitchinterval(previous_interval)

    def _yield_to_steps(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        # Called at each Python call of this thread only (millions in a compile, so the common case is one attribute
        # read and a comparison); returning None traces no lines inside the call.
        if frame.f_code is _FX_TRACE:
            return self._hold_steps_back(frame)
        if self._gate.depth and not self._stopping:
            self._gate.wait_idle(_PAUSE_S)
        return None

    def _hold_steps_back(self, frame: FrameType) -> Callable[..., Any] | None:
        """Holds steps back for one torch.fx trace: the returned local tracer sees its frame return (normally or by
        an exception) and lets them go."""
        if not self._gate.enter_trace(unless=lambda: self._stopping):
            return None

        def on_return(traced: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
            if event == "return" and traced is frame:
                self._gate.exit_trace()
                return None
            return on_return

        return on_return


def _lowest_priority() -> None:
    """Nice 19 for the calling thread (Linux sets priority per thread) and the processes it starts."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
