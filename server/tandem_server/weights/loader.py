"""Copies checkpoint tensors into model parameters by their checkpoint names, strictly."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tandem_server.errors import WeightsError
from tandem_server.layers.linear import load_full
from tandem_server.weights.safetensors import iterate_tensors


@torch.inference_mode()
def load_weights(model: nn.Module, model_path: Path, skipped: frozenset[str]) -> None:
    """Fills every parameter exactly once; unknown, missing or misshapen tensors are errors."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in iterate_tensors(model_path):
        if name in skipped:
            continue
        param = params.get(name)
        if param is None:
            raise WeightsError(f"checkpoint tensor {name!r} has no matching model parameter")
        loader = getattr(param, "weight_loader", load_full)
        try:
            loader(param, tensor.to(param.dtype))
        except ValueError as error:
            raise WeightsError(f"{name}: {error}") from error
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:5])}")
