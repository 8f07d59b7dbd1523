"""The decode package's constants, shared with the eager model's tensors wherever they hold the same values.

A package carries its own copy of every weight it reads (its frozen constants), and the shard keeps the eager model
for everything else, so each weight would be resident twice. Loaded through here, a package constant that equals one
of the model's tensors (same dtype, shape, strides and bytes) is that tensor: the package holds a reference to its
storage and no copy. Only constants the model has no twin of (folded ones, such as precomputed tables) keep a copy.

Invariant: the model's tensors are never written after loading (weights are read-only while serving), so a shared
constant always equals what the package was built with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import torch
from torch import nn

# Shared tensors are at least as aligned as torch's CPU allocator makes them, which no generated kernel outruns.
_CONSTANT_ALIGNMENT = 64
# Attribute objects (weights' holders) are searched this deep for tensors below each module.
_SEARCH_DEPTH = 3

_TensorKey = tuple[torch.dtype, tuple[int, ...], tuple[int, ...], bytes]


@dataclass(frozen=True)
class PackageConstants:
    """The constants to hand the package, and how many of their bytes are the model's own tensors."""

    tensors: dict[str, torch.Tensor]
    shared_bytes: int
    copied_bytes: int


def load_sharing_model(library: Path, weights: Path, model: nn.Module) -> PackageConstants:
    """Reads the package's constants from `weights` and pairs each with its twin among `model`'s tensors; keyed by
    the names the package's runner takes them under."""
    reader = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
    reader.update_constant_buffer_from_blob(str(weights))  # type: ignore[attr-defined]  # bound, not in torch's stubs
    # The reader hands constants out under their original names, and takes them back under its own.
    names = {original: name for name, original in reader.get_constant_names_to_original_fqns().items()}
    packaged = reader.extract_constants_map(False)
    if sorted(packaged) != sorted(names):
        raise ValueError(f"the package's constants ({len(packaged)}) are not all named ({len(names)})")
    # Only tensors shaped like some constant are read (never, say, a KV cache the model's attention holds).
    twins = _index(
        tensor for tensor in model_tensors(model) if _layout(tensor) in {_layout(c) for c in packaged.values()}
    )
    tensors: dict[str, torch.Tensor] = {}
    shared = copied = 0
    for original, constant in packaged.items():
        twin = twins.get(_key(constant)) if _comparable(constant) else None
        if twin is not None and torch.equal(twin, constant):
            tensors[names[original]] = twin.detach()
            shared += _nbytes(constant)
        else:
            # The extracted tensors view the reader's blob, which goes with the reader.
            tensors[names[original]] = constant.clone()
            copied += _nbytes(constant)
    return PackageConstants(tensors, shared, copied)


def model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Every tensor the model's modules hold: parameters, buffers and the tensors inside their attribute objects
    (quantized weights keep their packed tensors in plain objects)."""
    seen: set[int] = set()
    for module in model.modules():
        for name, value in vars(module).items():
            if name != "_modules":
                yield from _tensors_in(value, seen, _SEARCH_DEPTH)


def _tensors_in(value: object, seen: set[int], depth: int) -> Iterator[torch.Tensor]:
    if id(value) in seen or depth < 0 or isinstance(value, nn.Module):
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item, seen, depth - 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, seen, depth - 1)
    elif is_dataclass(value) and not isinstance(value, type):
        for field in fields(value):
            yield from _tensors_in(getattr(value, field.name), seen, depth - 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for item in vars(value).values():
            yield from _tensors_in(item, seen, depth - 1)


def _index(tensors: Iterator[torch.Tensor]) -> dict[_TensorKey, torch.Tensor]:
    return {_key(tensor): tensor for tensor in tensors if _shareable(tensor)}


def _comparable(tensor: torch.Tensor) -> bool:
    return (
        type(tensor) in (torch.Tensor, nn.Parameter)
        and tensor.device.type == "cpu"
        and tensor.numel() > 0
        and tensor.is_contiguous()
        and _has_storage(tensor)
    )


def _has_storage(tensor: torch.Tensor) -> bool:
    try:
        tensor.untyped_storage()
    except RuntimeError:  # a tensor without storage (an inference-mode view's wrapper, a meta-like placeholder)
        return False
    return True


def _layout(tensor: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...]]:
    return tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())


def _shareable(tensor: torch.Tensor) -> bool:
    """Whether the package may read `tensor` in place of its own constant (its blob aligns every constant)."""
    return _comparable(tensor) and tensor.data_ptr() % _CONSTANT_ALIGNMENT == 0


def _key(tensor: torch.Tensor) -> _TensorKey:
    """Equal tensors have equal keys; unequal ones almost never do, and `torch.equal` settles those."""
    content = tensor.detach().reshape(-1).view(torch.uint8).numpy()
    digest = hashlib.blake2b(content.data, digest_size=16).digest()
    return (*_layout(tensor), digest)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
