"""Activations of feed-forwards (gated `down(act(gate(x)) * up(x))` or plain), looked up by config.json's name."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from tandem_server.errors import ConfigError

Activation = Callable[[torch.Tensor], torch.Tensor]


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (Nemotron-H's feed-forwards, which have no gate)."""
    return F.relu(x).square()


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """The sigmoid approximation of GELU that CLIP was trained with."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "relu2": relu_squared,
    "quick_gelu": quick_gelu,
}


def activation(name: str) -> Activation:
    """The activation config.json calls `name`, or an error listing the supported ones."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
