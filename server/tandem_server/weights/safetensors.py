"""Iterates a checkpoint's safetensors files tensor by tensor, unread (memory-mapped, never pickle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open

from tandem_server.errors import WeightsError
from tandem_server.weights.pickled import pickle_files
from tandem_server.weights.slicing import CheckpointTensor


def checkpoint_files(model_path: Path) -> list[Path]:
    """All `*.safetensors` files of the checkpoint, in name order."""
    files = sorted(model_path.glob("*.safetensors"))
    if files:
        return files
    pickled = pickle_files(model_path)
    if pickled:
        raise WeightsError(
            f"{model_path} holds only pickle weights ({', '.join(path.name for path in pickled[:3])}); Tandem loads "
            "safetensors only because unpickling can run arbitrary code: convert them to safetensors, or pass "
            "--allow-pickle-weights if you trust the files"
        )
    raise WeightsError(f"no *.safetensors files in {model_path}")


def iterate_tensors(model_path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yields `(checkpoint name, unread tensor)` for every tensor of every file; the caller reads what it needs."""
    for file in checkpoint_files(model_path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, CheckpointTensor(handle.get_slice(name))


def tensor_dtypes(model_path: Path) -> Iterator[tuple[str, str]]:
    """`(checkpoint name, safetensors dtype such as "F8_E4M3")` for every tensor, read from the headers alone (none
    for a checkpoint without safetensors files)."""
    for file in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, handle.get_slice(name).get_dtype()
