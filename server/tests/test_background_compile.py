"""The compile thread: it runs only while no step holds the gate, stops when asked, and reports what it raised."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import torch
from tandem_server.execution.background_compile import BackgroundCompile, StepGate


def _python_calls(count: int, progress: list[int]) -> Callable[[Callable[[], bool]], None]:
    def noop() -> None:
        return None

    def work(should_stop: Callable[[], bool]) -> None:
        for index in range(count):
            if should_stop():
                return
            noop()
            progress.append(index)

    return work


def test_the_work_pauses_at_its_python_calls_while_a_step_holds_the_gate() -> None:
    gate = StepGate()
    progress: list[int] = []
    compiling = BackgroundCompile("test-compile", _python_calls(2_000, progress), gate)
    with gate.step():
        compiling.start()
        time.sleep(0.5)
        # One call may run per 50 ms pause: about ten in half a second, against thousands when nothing steps.
        held = len(progress)
    assert held <= 15, held
    assert compiling.join(timeout=30)
    assert len(progress) == 2_000
    assert compiling.error is None


def test_a_nested_step_keeps_the_gate_held_until_the_outer_one_ends() -> None:
    gate = StepGate()
    with gate.step():
        with gate.step():
            pass
        assert not gate.wait_idle(0.01)
    assert gate.wait_idle(0.01)


def test_stop_ends_the_work_at_its_next_check() -> None:
    gate = StepGate()
    progress: list[int] = []
    compiling = BackgroundCompile("test-compile", _python_calls(10**9, progress), gate)
    compiling.start()
    time.sleep(0.1)
    compiling.stop()
    assert not compiling.running
    assert 0 < len(progress) < 10**9


def test_stop_inside_a_step_lets_the_work_run_unpaused_to_its_next_check() -> None:
    # A second Warmup holds the gate while it stops the compile: the work must not keep pausing for it.
    gate = StepGate()
    progress: list[int] = []

    calls = _python_calls(2_000, progress)

    def one_long_graph(should_stop: Callable[[], bool]) -> None:
        # Checks only when done, as a compile checks only between graphs.
        calls(lambda: False)
        should_stop()

    compiling = BackgroundCompile("test-compile", one_long_graph, gate)
    with gate.step():
        compiling.start()
        time.sleep(0.2)
        started = time.monotonic()
        compiling.stop()
        assert time.monotonic() - started < 5.0
    assert not compiling.running and len(progress) == 2_000


def test_what_the_work_raises_is_kept_and_the_thread_ends() -> None:
    def failing(should_stop: Callable[[], bool]) -> None:
        raise RuntimeError("no kernel for this shape")

    compiling = BackgroundCompile("test-compile", failing, StepGate())
    compiling.start()
    assert compiling.join(timeout=10)
    assert isinstance(compiling.error, RuntimeError)


def test_the_thread_runs_at_the_lowest_priority() -> None:

    seen: list[int] = []

    def record(should_stop: Callable[[], bool]) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    compiling = BackgroundCompile("test-compile", record, StepGate())
    compiling.start()
    assert compiling.join(timeout=10)
    assert seen == [19]


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_step_waits_for_a_torch_fx_trace_in_the_compile_thread() -> None:
    # torch.fx patches nn.Module.__call__ for every thread while it traces; an eager step in that window fails.
    gate = StepGate()
    inside_trace = threading.Event()

    class SlowToTrace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inside_trace.set()
            time.sleep(0.5)
            return x + 1

    def trace(should_stop: Callable[[], bool]) -> None:
        torch.fx.symbolic_trace(SlowToTrace())

    compiling = BackgroundCompile("test-compile", trace, gate)
    compiling.start()
    assert inside_trace.wait(timeout=10)
    with gate.step():
        # The gate was taken only once the trace had ended (without the wait this call fails inside the tracer).
        assert not torch.fx._symbolic_trace.is_fx_tracing()
        _Block()(torch.ones(1, 4))
    assert compiling.join(timeout=10) and compiling.error is None


def test_a_trace_waits_for_the_running_step() -> None:
    gate = StepGate()
    traced: list[float] = []

    def trace(should_stop: Callable[[], bool]) -> None:
        torch.fx.symbolic_trace(_Block())
        traced.append(time.monotonic())

    compiling = BackgroundCompile("test-compile", trace, gate)
    with gate.step():
        compiling.start()
        time.sleep(0.3)
        step_ended = time.monotonic()
        assert not traced
        _Block()(torch.ones(1, 4))
    assert compiling.join(timeout=10) and compiling.error is None
    assert traced[0] >= step_ended


def test_stopping_from_inside_a_step_lets_a_waiting_trace_run() -> None:
    # A second Warmup holds the gate while it stops the compile: a trace waiting for the gate must not deadlock it.
    gate = StepGate()

    def trace(should_stop: Callable[[], bool]) -> None:
        torch.fx.symbolic_trace(_Block())

    compiling = BackgroundCompile("test-compile", trace, gate)
    with gate.step():
        compiling.start()
        time.sleep(0.2)
        compiling.stop()
    assert not compiling.running and compiling.error is None
