"""Copies checkpoint tensors into model parameters by their checkpoint names, strictly, each rank its slice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from tandem_server.errors import WeightsError
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.pickled import iterate_pickled_tensors
from tandem_server.weights.safetensors import iterate_tensors
from tandem_server.weights.slicing import CheckpointTensor, load_full


@torch.inference_mode()
def load_weights(model: nn.Module, model_path: Path, layout: CheckpointLayout, allow_pickle: bool = False) -> None:
    """Fills every parameter once, reading only its `checkpoint_slice` (default: all); mismatches are errors."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for checkpoint_name, checkpoint_tensor in _checkpoint_tensors(model_path, allow_pickle):
        try:
            parts = list(layout.parameter_tensors(checkpoint_name, checkpoint_tensor))
        except ValueError as error:
            raise WeightsError(str(error)) from error
        for name, tensor in parts:
            param = params.get(name)
            if param is None:
                raise WeightsError(f"checkpoint tensor {checkpoint_name!r} has no matching model parameter {name!r}")
            loader = getattr(param, "weight_loader", load_full)
            try:
                loader(param, tensor.read(getattr(param, "checkpoint_slice", None)).to(param.dtype))
            except ValueError as error:
                raise WeightsError(f"{name}: {error}") from error
            loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:5])}")


def _checkpoint_tensors(model_path: Path, allow_pickle: bool) -> Iterator[tuple[str, CheckpointTensor]]:
    """Safetensors whenever the checkpoint has them; pickle files only when allowed and nothing else exists."""
    if allow_pickle and not any(model_path.glob("*.safetensors")):
        return iterate_pickled_tensors(model_path)
    return iterate_tensors(model_path)
