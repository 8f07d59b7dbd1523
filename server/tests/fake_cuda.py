"""A fake CUDA runtime for CPU tests: per-thread current devices, memory probes, streams, events and graphs that
record which device each call named and from which thread, with every CUDA tensor placed on the CPU instead.

The current device is per thread, as in the CUDA runtime: a thread that never called `set_device` is on device 0.
A call that names no device uses its thread's current device, so code that forgets to bind a worker thread shows
up as calls on device 0.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

DeviceLike = torch.device | str | int | None


@dataclass(frozen=True)
class CudaCall:
    name: str
    device: int
    thread: int


class FakeCuda:
    """Installs itself over `torch.cuda` (and `torch.Generator`) through a MonkeyPatch."""

    def __init__(self, free_bytes: int, device_count: int = 2) -> None:
        self.calls: list[CudaCall] = []
        self.free_bytes = free_bytes
        # Grows by `graph_pool_bytes` with every graph capture, as a captured graph's private pool does.
        self.reserved_bytes = 0
        self.graph_pool_bytes = 0
        self.device_count = device_count
        self._local = threading.local()
        self._lock = threading.Lock()
        # The test's own thread keeps real placement, so no mode outlives the test there.
        self._installing_thread = threading.get_ident()
        # Host memory registered with cudaHostRegister: address -> bytes.
        self.registered: dict[int, int] = {}

    def current(self) -> int:
        return getattr(self._local, "device", 0)

    def index(self, device: DeviceLike) -> int:
        """The device a call names, or the calling thread's current device when it names none."""
        if device is None:
            return self.current()
        if isinstance(device, int):
            return device
        parsed = torch.device(device)
        if parsed.type != "cuda":
            raise AssertionError(f"a CUDA call named {device!r}")
        return self.current() if parsed.index is None else parsed.index

    def names(self) -> list[str]:
        """The logged calls' names, in order."""
        return [call.name for call in self.calls]

    def record(self, name: str, device: DeviceLike = None) -> int:
        """Notes the call and makes the calling worker thread place CUDA tensors on the CPU from now on."""
        index = self.index(device)
        thread = threading.get_ident()
        with self._lock:
            self.calls.append(CudaCall(name, index, thread))
        if thread != self._installing_thread and not getattr(self._local, "redirecting", False):
            self._local.redirecting = True
            _CudaTensorsOnCpu(self).__enter__()
        return index

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self
        replacements: dict[str, Callable[..., Any]] = {
            "is_available": lambda: True,
            "device_count": lambda: fake.device_count,
            "set_device": fake._set_device,
            "current_device": lambda: fake.record("current_device"),
            "get_device_properties": fake._properties,
            "get_device_capability": fake._probe("get_device_capability", (9, 0)),
            "empty_cache": lambda: fake._probe("empty_cache", None)(None),
            "synchronize": fake._probe("synchronize", None),
            "reset_peak_memory_stats": fake._probe("reset_peak_memory_stats", None),
            "memory_allocated": fake._probe("memory_allocated", 0),
            "memory_reserved": lambda device=None: fake._probe("memory_reserved", fake.reserved_bytes)(device),
            "max_memory_allocated": fake._probe("max_memory_allocated", 4096),
            "mem_get_info": fake._probe("mem_get_info", (fake.free_bytes, 2**34)),
            "Stream": lambda device=None, priority=0: FakeStream(fake, fake.record("Stream", device)),
            "current_stream": lambda device=None: FakeStream(fake, fake.record("current_stream", device)),
            "stream": fake._stream_context,
            "Event": type("Event", (FakeEvent,), {"fake": fake}),
            "CUDAGraph": lambda *_, **__: FakeGraph(fake),
            "cudart": lambda: FakeRuntime(fake),
            "graph": fake._graph_context,
        }
        for name, replacement in replacements.items():
            monkeypatch.setattr(torch.cuda, name, replacement)
        real_generator = torch.Generator

        def generator(device: DeviceLike = "cpu") -> torch.Generator:
            if torch.device(device).type == "cuda":
                fake.record("Generator", device)
                return real_generator()
            return real_generator(device)

        monkeypatch.setattr(torch, "Generator", generator)

    def _probe(self, name: str, result: Any) -> Callable[[DeviceLike], Any]:
        def probe(device: DeviceLike = None) -> Any:
            self.record(name, device)
            return result

        return probe

    def _set_device(self, device: DeviceLike) -> None:
        index = self.index(device)
        self._local.device = index
        self.record("set_device", index)

    def _properties(self, device: DeviceLike = None) -> SimpleNamespace:
        self.record("get_device_properties", device)
        return SimpleNamespace(multi_processor_count=132, total_memory=2**34, major=9, minor=0)

    @contextlib.contextmanager
    def _stream_context(self, stream: FakeStream | None) -> Iterator[None]:
        if stream is not None:
            self.record("stream", stream.device)
        yield

    @contextlib.contextmanager
    def _graph_context(self, graph: FakeGraph, pool: object = None, stream: FakeStream | None = None) -> Iterator[None]:
        self.record("graph", stream.device if stream is not None else None)
        self.reserved_bytes += self.graph_pool_bytes
        with _Capture(graph):
            yield


@dataclass
class FakeStream:
    fake: FakeCuda
    device: int

    def wait_stream(self, other: FakeStream) -> None:
        self.fake.record("wait_stream", self.device)
        self.fake.record("wait_stream", other.device)

    def wait_event(self, event: FakeEvent) -> None:
        self.fake.record("Stream.wait_event", self.device)

    def synchronize(self) -> None:
        self.fake.record("Stream.synchronize", self.device)


@dataclass
class FakeRuntime:
    """The CUDA runtime calls `torch.cuda.cudart()` offers that Tandem makes; each returns success (0)."""

    fake: FakeCuda

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.fake.record("cudaHostRegister")
        assert address not in self.fake.registered, "registered twice"
        self.fake.registered[address] = size
        return 0

    def cudaHostUnregister(self, address: int) -> int:
        self.fake.record("cudaHostUnregister")
        del self.fake.registered[address]
        return 0


class FakeEvent:
    """Subclassed per FakeCuda (the class names its runtime), so isinstance checks against torch.cuda.Event hold."""

    fake: FakeCuda

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: FakeStream | None = None) -> None:
        self.fake.record("Event.record", stream.device if stream is not None else None)

    def synchronize(self) -> None:
        self.fake.record("Event.synchronize")

    def query(self) -> bool:
        """Done: the fake runs every copy at once."""
        self.fake.record("Event.query")
        return True

    def elapsed_time(self, other: FakeEvent) -> float:
        return 1.0


@dataclass
class FakeGraph:
    """Replays what was captured as a CUDA graph does: the same operators on the same tensors, each writing its
    result where it wrote at capture, with every host value (shapes, Python numbers) fixed at capture."""

    fake: FakeCuda
    operators: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = field(default_factory=list)

    def pool(self) -> object:
        return object()

    def replay(self) -> None:
        self.fake.record("CUDAGraph.replay")
        for func, args, kwargs, captured in self.operators:
            replayed = func(*args, **kwargs)
            for old, new in zip(tree_leaves(captured), tree_leaves(replayed), strict=True):
                # A result that aliases its inputs (a view, an in-place result) already sees the replayed values.
                if isinstance(old, torch.Tensor) and not _same_memory(old, new):
                    old.copy_(new)


def _same_memory(old: torch.Tensor, new: torch.Tensor) -> bool:
    return old.untyped_storage().data_ptr() == new.untyped_storage().data_ptr()


class _Capture(TorchDispatchMode):
    """Records every operator run while a graph captures; refuses a host read of a device value, which a CUDA
    graph capture refuses too."""

    def __init__(self, graph: FakeGraph) -> None:
        super().__init__()
        self._graph = graph

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError("operation not permitted when stream is capturing: a host read of a device value")
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self._graph.operators.append((func, args, kwargs, result))
        return result


# Torch calls that read a device tensor on the host: each one waits for every kernel queued before it.
_HOST_READS = frozenset(
    {
        torch.Tensor.cpu,
        torch.Tensor.tolist,
        torch.Tensor.item,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }
)


# A method wrapper: a new object at each lookup, equal to the others.
_DEVICE_OF = torch.Tensor.device.__get__  # type: ignore[attr-defined]


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, "fake_cuda", False)


class _CudaTensorsOnCpu(TorchFunctionMode):
    """Turns every CUDA device argument into the CPU, noting which CUDA device it named (thread-local, like every
    torch function mode).

    It keeps the stream's log too: tensors made on a CUDA device, and everything computed from them, carry
    `fake_cuda`; each torch call on them is logged as a "kernel" (views included, so a count is an upper bound),
    and each transfer between host and device as a copy that is asynchronous or blocking as the CUDA runtime
    would make it.
    """

    def __init__(self, fake: FakeCuda) -> None:
        super().__init__()
        self._fake = fake

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.device:
            return func(*args, **kwargs)
        if func == _DEVICE_OF and _on_device(args[0]):
            # A device tensor says where it lives, so code that follows a tensor's device stays on the device.
            return torch.device("cuda", self._fake.current())
        if func is torch.Tensor.pin_memory:
            # A pinned copy, marked as such for the host copy below to read.
            pinned = args[0].clone()
            pinned.fake_pinned = True
            return pinned
        names_cuda = any(self._is_cuda(value) for value in (*args, *kwargs.values()))
        reads_device = any(_on_device(value) for value in tree_leaves((args, kwargs)))
        transfer = self._log_transfer(func, args, kwargs, names_cuda, reads_device)
        pinned = kwargs.pop("pin_memory", False)
        kwargs = {key: self._place(value) for key, value in kwargs.items()}
        result = func(*(self._place(arg) for arg in args), **kwargs)
        if transfer == "to device" and args and result is args[0]:
            # The device copy of a host tensor is a tensor of its own, as on a real device.
            result = result.clone()
        tensors = [leaf for leaf in tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        launches = transfer is None and (reads_device or names_cuda) and (tensors or func is torch.Tensor.__setitem__)
        if launches:
            self._fake.record("kernel")
        for tensor in tensors:
            if transfer == "to device" or launches:
                tensor.fake_cuda = True
            if pinned:
                tensor.fake_pinned = True
        return result

    def _log_transfer(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names_cuda: bool, reads_device: bool
    ) -> str | None:
        """Logs a copy between host and device: "to device" or "to host" for one, None for any other call."""
        if func is torch.Tensor.to:
            if self._note_host_copy(args, kwargs):
                return "to device"
            if reads_device and any(self._is_cpu(value) for value in (*args[1:], *kwargs.values())):
                self._fake.record("blocking device copy")
                return "to host"
        elif func in (torch.tensor, torch.as_tensor) and names_cuda:
            # Built from host data straight into device memory: a copy from pageable memory, which waits.
            self._fake.record("blocking host copy", kwargs.get("device"))
            return "to device"
        elif func is torch.Tensor.copy_ and not _on_device(args[0]) and _on_device(args[1]):
            asynchronous = kwargs.get("non_blocking", False) and getattr(args[0], "fake_pinned", False)
            self._fake.record("async device copy" if asynchronous else "blocking device copy")
            return "to host"
        elif func in _HOST_READS and reads_device:
            self._fake.record("blocking device copy")
            return "to host"
        return None

    def _note_host_copy(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A `.to(cuda)` of a host tensor: asynchronous only from pinned memory with `non_blocking=True`; any
        other copy waits for every kernel queued before it, as the CUDA runtime does. True when it is one."""
        targets = [*args[1:], kwargs.get("device")]
        target = next((value for value in targets if self._is_cuda(value)), None)
        if target is None or _on_device(args[0]):
            return False
        asynchronous = kwargs.get("non_blocking", False) and getattr(args[0], "fake_pinned", False)
        self._fake.record("async host copy" if asynchronous else "blocking host copy", target)
        return True

    @staticmethod
    def _is_cuda(value: Any) -> bool:
        return (isinstance(value, str) and value.startswith("cuda")) or (
            isinstance(value, torch.device) and value.type == "cuda"
        )

    @staticmethod
    def _is_cpu(value: Any) -> bool:
        return (isinstance(value, str) and value == "cpu") or (isinstance(value, torch.device) and value.type == "cpu")

    def _place(self, value: Any) -> Any:
        if self._is_cuda(value):
            self._fake.record("tensor placement", value)
            return torch.device("cpu")
        return value
