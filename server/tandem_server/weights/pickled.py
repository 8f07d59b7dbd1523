"""Pickle checkpoints (`*.bin`, `*.pt`, `*.pth`), loaded only behind `--allow-pickle-weights`.

Unpickling can run code chosen by whoever wrote the file, so Tandem loads safetensors unless told otherwise; even
then torch's restricted `weights_only` unpickler is used, which accepts tensors and plain containers only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from tandem_server.errors import WeightsError
from tandem_server.weights.slicing import CheckpointTensor

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def pickle_files(model_path: Path) -> list[Path]:
    """The checkpoint's pickle weight files, in name order (training state such as optimizer.pt excluded)."""
    files = [path for path in model_path.iterdir() if path.is_file() and path.suffix in PICKLE_SUFFIXES]
    return sorted(path for path in files if not path.name.startswith(("optimizer", "scheduler", "training_args")))


class _LoadedTensor:
    """A tensor already in memory, behind the same interface as a safetensors slice."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
        return self._tensor[index]


def iterate_pickled_tensors(model_path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yields `(checkpoint name, tensor)` from every pickle file, memory-mapped where torch can."""
    files = pickle_files(model_path)
    if not files:
        raise WeightsError(f"no *.safetensors nor pickle weight files ({', '.join(PICKLE_SUFFIXES)}) in {model_path}")
    for file in files:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # torch reports bad or unsafe pickles with several exception types
            raise WeightsError(f"cannot load pickle weights {file}: {error}") from error
        if not isinstance(state, dict):
            raise WeightsError(f"{file} holds a {type(state).__name__}, not a state dict of named tensors")
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                raise WeightsError(f"{file}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
            yield name, CheckpointTensor(_LoadedTensor(tensor))
