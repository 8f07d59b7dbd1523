"""What an attention backend declares it serves, and the registry that names every backend; torch-free.

The shard's start-up selection checks a model and device against these declarations; the launcher reads them, without
importing torch or any kernel package, for the backend names and the KV block size the chosen backend reads best.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tandem_server.errors import ConfigError

# Tokens per KV block when neither the user nor a backend's fast paged path asks for another size.
DEFAULT_BLOCK_SIZE = 16
AUTO = "auto"


@dataclass(frozen=True)
class PageSizes:
    """The KV block sizes a kernel reads."""

    # Blocks must hold a multiple of this many tokens.
    multiple: int = 1
    # The one block size its faster paged path reads; None: every size it reads takes the same path.
    fast: int | None = None
    # How that fast path loads a page, for messages ("TMA").
    fast_loads: str = ""


@dataclass(frozen=True)
class PackageRelease:
    """One release of an optional kernel package a backend drives: where it lives and what it needs."""

    name: str
    module: str
    # The pip distribution that installs it: the launcher reads its version without importing the module.
    distribution: str
    # The module's attribute the backend calls; None: the module itself.
    entry_point: str | None = None
    # Compute capability majors the release has kernels for; None: every GPU the package runs on.
    capability_majors: tuple[int, ...] | None = None
    pages: PageSizes = PageSizes()

    def load(self) -> Any:
        """The release's entry point (imports the package)."""
        module = importlib.import_module(self.module)
        return module if self.entry_point is None else getattr(module, self.entry_point)

    def import_problem(self) -> str | None:
        """Why the release's entry point does not import, or None when it does."""
        try:
            self.load()
        except (ImportError, AttributeError, OSError, RuntimeError) as error:
            return f"{self.module} is not importable ({error})"
        return None

    def capability_problem(self, capability: tuple[int, int] | None) -> str | None:
        """Why this release has no kernels for a GPU of `capability` (None: no GPU), or None when it has."""
        if capability is None or self.capability_majors is None or capability[0] in self.capability_majors:
            return None
        return f"{self.name} has no kernels for compute capability {capability[0]}.{capability[1]}"

    def page_problem(self, block_size: int) -> str | None:
        """Why this release cannot read blocks of `block_size` tokens, or None when it can."""
        if block_size % self.pages.multiple:
            return (
                f"{self.name} reads the paged KV cache only in blocks of a multiple of {self.pages.multiple} tokens, "
                f"not {block_size}"
            )
        return None


def choose_release(
    releases: Iterable[PackageRelease], capability: tuple[int, int] | None
) -> tuple[PackageRelease | None, tuple[str, ...]]:
    """The first of `releases` that imports and has kernels for `capability`, and why each earlier one does not fit."""
    problems: list[str] = []
    for release in releases:
        problem = release.import_problem() or release.capability_problem(capability)
        if problem is None:
            return release, tuple(problems)
        problems.append(problem)
    return None, tuple(problems)


@dataclass(frozen=True)
class BackendCapabilities:
    """What one attention backend serves; start-up selection passes over a backend a model or device asks more of."""

    # How messages name its kernel ("the Triton kernel").
    kernel: str
    devices: tuple[str, ...]
    # The model dtypes it computes in, by name ("bfloat16"); empty: every dtype the shard runs.
    dtypes: tuple[str, ...] = ()
    # None: any head size.
    max_head_size: int | None = None
    head_size_multiple: int = 1
    # True when it attends over a KV cache in a dtype other than the model's (--kv-cache-dtype).
    other_kv_cache_dtype: bool = False
    logit_softcap: bool = True
    sliding_window: bool = True
    # True when it attends over multi-head latent attention's (MLA's) latent cache.
    latent_attention: bool = False
    # True when it adds a learned sink per head to the softmax's denominator (`AttentionParams.sinks`).
    attention_sinks: bool = False
    # True when it lets the positions of one span (an image's) attend to each other in both directions, as the
    # step's host layout lists the spans (`HostLayout.bidirectional_spans`).
    bidirectional_spans: bool = False
    # True when a decode-only step runs with fixed shapes and no host sync, so it can be captured in a CUDA graph.
    cuda_graphs: bool = False
    # The block sizes it reads; a backend that drives a package release reads the sizes that release declares.
    pages: PageSizes = PageSizes()
    # The optional package releases it can drive, preferred first; empty: it needs no optional package.
    releases: tuple[PackageRelease, ...] = ()
    # How to install a release, added to the reason none is usable.
    install_hint: str = ""
    # The devices where `auto` may take it, each with its priority there: `auto` tries lower priorities first.
    auto_priority: Mapping[str, int] = field(default_factory=dict)
    # Set when `auto` takes it only at its release's fast page size: the kernel that is faster at every other size.
    auto_only_at_fast_pages_over: str | None = None


@dataclass(frozen=True)
class BackendSettings:
    """The shard's flags a backend may be built with."""

    # The torch backend's budget for its decode mirror, in bytes (None: half of the KV cache it binds); the other
    # backends keep none.
    decode_mirror_memory: int | None = 0


class BackendClass(Protocol):
    """A registered backend's class: it declares its capabilities and builds itself from the shard's settings."""

    capabilities: ClassVar[BackendCapabilities]

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> Any:
        """A new backend (an `AttentionBackend`) for these settings; optional packages are imported here."""
        ...


@dataclass(frozen=True)
class RegisteredBackend:
    """One registry entry: the backend's name, where its class lives and what it serves."""

    name: str
    # "package.module:Class", imported only when the backend is built.
    factory: str
    capabilities: BackendCapabilities

    def load_class(self) -> BackendClass:
        """The backend's class (imports its module, not its optional packages)."""
        module, _, attribute = self.factory.partition(":")
        backend_class: BackendClass = getattr(importlib.import_module(module), attribute)
        return backend_class


class BackendRegistry:
    """Every attention backend by name; `auto`'s order on each device follows their declared priorities."""

    def __init__(self, backends: Iterable[RegisteredBackend]) -> None:
        self._backends: dict[str, RegisteredBackend] = {}
        for backend in backends:
            if backend.name == AUTO or backend.name in self._backends:
                raise ValueError(f"invariant: attention backend names are unique and not {AUTO!r}: {backend.name!r}")
            self._backends[backend.name] = backend

    @property
    def names(self) -> tuple[str, ...]:
        """Every registered backend, in registration order."""
        return tuple(self._backends)

    @property
    def choices(self) -> tuple[str, ...]:
        """The values of --attention-backend."""
        return (AUTO, *self._backends)

    def entry(self, name: str) -> RegisteredBackend:
        """The registry entry of `name`; an unknown name is a configuration error."""
        if name not in self._backends:
            raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(self.names)}")
        return self._backends[name]

    def capabilities(self, name: str) -> BackendCapabilities:
        """What backend `name` serves."""
        return self.entry(name).capabilities

    def names_with(self, feature: Callable[[BackendCapabilities], bool]) -> tuple[str, ...]:
        """The backends whose capabilities have `feature`, in registration order."""
        return tuple(name for name, entry in self._backends.items() if feature(entry.capabilities))

    def auto_order(self, device: str) -> tuple[str, ...]:
        """The backends `auto` tries on `device`, first to last."""
        priorities = {name: entry.capabilities.auto_priority.get(device) for name, entry in self._backends.items()}
        ranked = {name: priority for name, priority in priorities.items() if priority is not None}
        return tuple(sorted(ranked, key=ranked.__getitem__))

    def _devices(self) -> tuple[str, ...]:
        """Every device some backend runs on, in registration order."""
        found = (device for entry in self._backends.values() for device in entry.capabilities.devices)
        return tuple(dict.fromkeys(found))

    def describe_auto(self) -> str:
        """What `auto` means, for help texts: "the first usable of flash, triton, ... on CUDA, torch on CPU"."""
        orders = {device: self.auto_order(device) for device in self._devices()}
        described = [f"{', '.join(order)} on {device.upper()}" for device, order in orders.items() if order]
        return f"the first usable of {', '.join(described)}"

    def create(self, name: str, settings: BackendSettings) -> Any:
        """A new instance of backend `name` (an `AttentionBackend`); optional packages are imported only here."""
        return self.entry(name).load_class().from_settings(settings)
