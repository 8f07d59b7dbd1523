"""Shared fixtures of the shard's tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

# The name of the thread a background compile runs on (execution/compiled_decode.py).
COMPILE_THREAD = "decode-graph-compile"


@pytest.fixture(autouse=True)
def no_background_compile_outlives_its_test() -> Iterator[None]:
    """A compile left running traces with torch.fx, which patches nn.Module.__call__ for every thread, so a later
    test's eager steps would fail inside the tracer: every test stops or joins what it started."""
    yield
    leaked = [thread for thread in threading.enumerate() if thread.name == COMPILE_THREAD and thread.is_alive()]
    assert not leaked, "the test left a background compile running; stop it (Execution.stop) or compile off"
