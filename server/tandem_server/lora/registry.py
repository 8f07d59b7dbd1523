"""The shard's LoRA adapters: loaded and forgotten by name, kept in memory least recently used first, and turned
into each step's per-row deltas. It owns the adapters' tensors; request state holds only adapter names."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tandem_server.device_copy import to_device
from tandem_server.errors import LoraAdapterError, LoraAdapterExistsError, LoraAdapterNotFoundError
from tandem_server.layers.gemm import GemmModule
from tandem_server.lora.adapter import AdapterPlacement, AdapterSummary, LoraAdapter, load_adapter
from tandem_server.lora.segmented import STACKED_ROWS, AdapterStack, GroupedDeltas, RowsDelta, StackedDeltas
from tandem_server.lora.slots import SEGMENTED_ROWS, DeviceSlots, RowBlocks, SlottedDeltas
from tandem_server.lora.step import LoraStep
from tandem_server.lora.targets import find_targets

logger = logging.getLogger(__name__)

# The name that selects the base model alone.
BASE_MODEL = ""


@dataclass(frozen=True)
class LoraLimits:
    """`--max-loras` (distinct adapters one Step may carry; 0 serves none), `--max-lora-rank`, and
    `--max-cpu-loras` (adapters whose tensors stay in memory; None: every loaded one)."""

    max_loras: int = 4
    max_rank: int = 64
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if self.max_loras < 0 or self.max_rank < 1:
            raise ValueError(f"invariant: --max-loras >= 0 and --max-lora-rank >= 1, got {self}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"invariant: --max-cpu-loras >= --max-loras, got {self}")


class LoraRegistry:
    """Adapters by name in load order. Each keeps its tensors in memory while it is among the `max_cpu_loras` most
    recently used, and is read again from its directory when a step needs it after that. The tensors live on the
    model's device (CPU), or on the host with the ones steps run in device slots (CUDA)."""

    def __init__(
        self,
        model: nn.Module,
        limits: LoraLimits,
        dtype: torch.dtype,
        device: torch.device,
        device_slots: bool | None = None,
    ) -> None:
        """`device_slots` (default: on CUDA) keeps the adapters on the host and `max_loras` slots of them on
        `device`, applied by the Triton kernels; otherwise every adapter stays on `device`, applied in torch."""
        self.limits = limits
        self._targets = find_targets(model)
        self._known: dict[str, AdapterSummary] = {}
        # The adapters whose tensors are in memory, least recently used first; their names are a subset of `_known`.
        self._resident: OrderedDict[str, LoraAdapter] = OrderedDict()
        # What `adapters` reads: replaced whole at each change, so another thread reads one consistent listing.
        self._listing: tuple[AdapterSummary, ...] = ()
        self._slots: DeviceSlots | None = None
        if (device_slots if device_slots is not None else device.type == "cuda") and limits.max_loras > 0:
            self._slots = DeviceSlots(self._targets, limits.max_loras, limits.max_rank, dtype, device)
            logger.info(
                "LoRA: %d device slots of rank up to %d will take %.1f MiB",
                limits.max_loras,
                limits.max_rank,
                self._slots.nbytes / 2**20,
            )
            device = torch.device("cpu")
        self._placement = AdapterPlacement(dtype, device, limits.max_rank)
        # Per GEMM module, the stacked deltas of the adapters (by name) the latest small step ran: at most one stack
        # per module, reused while steps run the same adapters; emptied whenever the adapters change.
        self._stacks: dict[str, tuple[tuple[str, ...], AdapterStack]] = {}

    @property
    def adapters(self) -> tuple[AdapterSummary, ...]:
        """The loaded adapters in load order, in memory or not; safe to read from any thread."""
        return self._listing

    @property
    def resident(self) -> tuple[str, ...]:
        """The adapters whose tensors are in memory, least recently used first."""
        return tuple(self._resident)

    @property
    def device_bytes(self) -> int:
        """Device memory the adapter slots take once a step runs an adapter (0 without slots)."""
        return self._slots.nbytes if self._slots is not None else 0

    def names(self) -> frozenset[str]:
        return frozenset(self._known)

    def load(self, name: str, directory: Path) -> AdapterSummary:
        """Loads adapter `name` from a PEFT directory; on any error nothing changes."""
        if self.limits.max_loras == 0:
            raise LoraAdapterError(f"LoRA adapter {name!r}: this shard serves no adapters (--max-loras 0)")
        if name == BASE_MODEL:
            raise LoraAdapterError("a LoRA adapter needs a non-empty name (the empty name selects the base model)")
        if name in self._known:
            raise LoraAdapterExistsError(f"LoRA adapter {name!r} is already loaded")
        adapter = self._read(name, directory)
        summary = AdapterSummary(name, adapter.rank, adapter.target_modules, directory)
        self._known[name] = summary
        self._listing = tuple(self._known.values())
        self._keep(adapter, protected={name})
        logger.info(
            "loaded LoRA adapter %r (rank %d, %s; %.1f MiB)",
            name,
            adapter.rank,
            ", ".join(adapter.target_modules),
            adapter.nbytes / 2**20,
        )
        return summary

    def unload(self, name: str) -> None:
        """Forgets adapter `name`; a step already launched under it keeps its tensors until it completes."""
        if self._known.pop(name, None) is None:
            raise LoraAdapterNotFoundError(f"no LoRA adapter named {name!r} is loaded")
        self._listing = tuple(self._known.values())
        self._release(name)
        logger.info("unloaded LoRA adapter %r", name)

    def make_resident(self, names: Iterable[str]) -> dict[str, str]:
        """Brings the tensors of the loaded adapters `names` (at most `max_loras`, BASE_MODEL ignored) into memory,
        reading again those that left it, and marks them most recently used. Returns why each adapter that could
        not be read again is unavailable, by name; it stays loaded, and the others are resident."""
        unreadable: dict[str, str] = {}
        needed = set(names) - {BASE_MODEL}
        for name in sorted(needed):
            if name in self._resident:
                self._resident.move_to_end(name)
                continue
            summary = self._known[name]
            try:
                adapter = self._read(name, summary.directory)
            except LoraAdapterError as error:
                unreadable[name] = f"LoRA adapter {name!r} could not be read again from {summary.directory}: {error}"
                continue
            logger.info("read LoRA adapter %r again from %s", name, summary.directory)
            self._keep(adapter, protected=needed)
        return unreadable

    def _read(self, name: str, directory: Path) -> LoraAdapter:
        adapter = load_adapter(name, directory, self._targets, self._placement)
        return self._slots.staged(adapter) if self._slots is not None else adapter

    def _keep(self, adapter: LoraAdapter, protected: set[str]) -> None:
        """Makes `adapter` resident, then lets the least recently used adapters outside `protected` leave memory
        while more than `max_cpu_loras` are resident."""
        self._resident[adapter.name] = adapter
        self._stacks.clear()
        limit = self.limits.max_cpu_loras
        evictable = [name for name in self._resident if name not in protected]
        while limit is not None and len(self._resident) > limit and evictable:
            name = evictable.pop(0)
            self._release(name)
            logger.info(
                "LoRA adapter %r left memory (--max-cpu-loras %d); it is read again when a request names it",
                name,
                limit,
            )

    def _release(self, name: str) -> None:
        """Drops the tensors of adapter `name`, wherever they are kept."""
        self._resident.pop(name, None)
        self._stacks.clear()
        if self._slots is not None:
            self._slots.forget(name)

    def step(self, adapter_names: Sequence[str], row_counts: Sequence[int], device: torch.device) -> LoraStep | None:
        """The deltas of a step whose span i runs `row_counts[i]` rows under `adapter_names[i]` (BASE_MODEL: none);
        None when no span names an adapter, so the step runs exactly as without LoRA."""
        present = sorted(set(adapter_names) - {BASE_MODEL})
        if not present:
            return None
        missing = [name for name in present if name not in self._resident]
        if missing:
            raise ValueError(f"invariant: requests under adapters {missing} out of memory failed before the step")
        # Each token row's adapter: 0 the base model, k the adapter present[k - 1].
        span_adapter = torch.tensor([present.index(name) + 1 if name in present else 0 for name in adapter_names])
        row_adapter = torch.repeat_interleave(span_adapter, torch.tensor(list(row_counts)))
        adapters = [self._resident[name] for name in present]
        if self._slots is None and row_adapter.shape[0] <= STACKED_ROWS:
            return self._stacked(adapters, row_adapter, device)
        if self._slots is None:
            return self._grouped(adapters, row_adapter, device)
        return self._slotted(self._slots, adapters, row_adapter, device)

    def _grouped(self, adapters: list[LoraAdapter], row_adapter: torch.Tensor, device: torch.device) -> LoraStep:
        changes: dict[str, list[RowsDelta]] = {}
        for number, adapter in enumerate(adapters, start=1):
            rows = to_device((row_adapter == number).nonzero().squeeze(1), device)
            for gemm_path, delta in adapter.deltas.items():
                changes.setdefault(gemm_path, []).append(RowsDelta(rows, delta))
        modules = tuple((self._module(path), GroupedDeltas(tuple(groups))) for path, groups in changes.items())
        return LoraStep(modules, len(adapters))

    def _stacked(self, adapters: list[LoraAdapter], row_adapter: torch.Tensor, device: torch.device) -> LoraStep:
        names = tuple(adapter.name for adapter in adapters)
        row_adapter = to_device(row_adapter, device)
        modules = []
        for path in dict.fromkeys(path for adapter in adapters for path in adapter.deltas):
            cached_names, stack = self._stacks.get(path, ((), None))
            if stack is None or cached_names != names:
                numbered = [(n, a.deltas[path]) for n, a in enumerate(adapters, start=1) if path in a.deltas]
                stack = AdapterStack.of(numbered)
                self._stacks[path] = (names, stack)
            modules.append((self._module(path), StackedDeltas.of(stack, row_adapter)))
        return LoraStep(tuple(modules), len(adapters))

    def _slotted(
        self, slots: DeviceSlots, adapters: list[LoraAdapter], row_adapter: torch.Tensor, device: torch.device
    ) -> LoraStep:
        slot_of = slots.place(adapters)
        slot_by_number = torch.tensor([-1, *(slot_of[adapter.name] for adapter in adapters)])
        rows = (row_adapter > 0).nonzero().squeeze(1)
        row_slots = slot_by_number[row_adapter[rows]]
        blocks = RowBlocks.of(rows, row_slots, device) if rows.shape[0] >= SEGMENTED_ROWS else None
        rows, row_slots = to_device(rows, device), to_device(row_slots, device)
        paths = dict.fromkeys(path for adapter in adapters for path in adapter.deltas)
        modules = tuple(
            (self._module(path), SlottedDeltas(slots.stacks[path], rows, row_slots, blocks)) for path in paths
        )
        return LoraStep(modules, len(adapters))

    def _module(self, gemm_path: str) -> GemmModule:
        return self._targets.gemms[gemm_path].module
