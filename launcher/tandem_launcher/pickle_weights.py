"""Pickle weights of a downloaded repo (only behind --allow-pickle-weights) converted once into a cached safetensors
directory, as TGI does, so the shards never unpickle anything from the Hub."""

from __future__ import annotations

import json
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

from tandem_launcher.conversion_cache import converted_once
from tandem_launcher.hub_files import PICKLE_WEIGHTS, SERVING_FILES

if TYPE_CHECKING:
    import torch


class PickleConversionError(Exception):
    """A pickle checkpoint that torch's restricted unpickler refuses or that holds no tensors."""


def has_only_pickle_weights(path: Path) -> bool:
    return not any(path.glob("*.safetensors")) and any(path.glob(PICKLE_WEIGHTS))


def converted_pickle_dir(snapshot: Path, cache_dir: Path, cache_name: str) -> Path:
    """The safetensors conversion of `snapshot` under `cache_dir/cache_name`, converting it first if needed."""
    return converted_once(
        cache_dir,
        cache_name,
        f"convert the pickle weights of {snapshot} to safetensors",
        lambda output: convert_pickle_checkpoint(snapshot, output),
    )


def convert_pickle_checkpoint(source: Path, output: Path) -> None:
    """One safetensors file per pickle file (with an index when there are several), plus the serving files."""
    import torch  # noqa: PLC0415  (heavy imports only when a conversion is needed)
    from safetensors.torch import save_file  # noqa: PLC0415

    pickles = sorted(path for path in source.iterdir() if fnmatch(path.name, PICKLE_WEIGHTS))
    if not pickles:
        raise PickleConversionError(f"{source} has no {PICKLE_WEIGHTS} files to convert")
    weight_map: dict[str, str] = {}
    for number, pickle_path in enumerate(pickles, start=1):
        name = "model.safetensors" if len(pickles) == 1 else f"model-{number:05d}-of-{len(pickles):05d}.safetensors"
        try:
            # weights_only: torch's restricted unpickler, which builds tensors and plain containers and nothing else.
            state = torch.load(pickle_path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:
            raise PickleConversionError(f"torch refuses to load {pickle_path} as plain weights: {error}") from error
        tensors = _tensors(state, pickle_path)
        save_file(tensors, output / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        del state, tensors
    if len(pickles) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (output / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for name in SERVING_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, output / name)
    for path in output.iterdir():
        path.chmod(0o644)


def _tensors(state: object, path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, each with storage of its own (safetensors refuses tensors sharing memory)."""
    import torch  # noqa: PLC0415

    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PickleConversionError(f"{path} is not a flat dictionary of tensors")
    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        shared = key in seen or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()
        seen.add(key)
        tensors[str(name)] = tensor.clone().contiguous() if shared else tensor.contiguous()
    return tensors
