"""Tensors built without values live on meta, taking no memory, until a parameter that needs storage gets it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tandem_server.layers.linear import StackedColumns, swap_storage
from tandem_server.layers.moe.experts import RoutedExperts

_UNINITIALISED = {torch.empty, torch.empty_like, torch.Tensor.new_empty}


class UninitialisedOnMeta(TorchFunctionMode):
    """Builds every tensor made without values (`torch.empty`, `empty_like`, `new_empty`) on meta: it has nothing to
    lose there. Tensors computed at construction (rotary tables, scales) stay on the device with their values."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _UNINITIALISED:
            kwargs["device"] = torch.device("meta")
        return func(*args, **kwargs)


def allocate(model: nn.Module, device: torch.device, needs_storage: Callable[[nn.Parameter], bool]) -> None:
    """Gives every parameter of `model` still on meta that `needs_storage` picks uninitialised storage on `device`.

    A stack gets its storage as a whole once any of its parts is picked, its parts staying views into it (the bias
    stack likewise): a stacked GEMM multiplies by the stack. A layer's routed experts likewise: their grouped GEMMs
    multiply by the experts' stacks.
    """
    for module in model.modules():
        if isinstance(module, RoutedExperts) and module.gate_up.is_meta:
            parts = [param for projections in module.projections() for param in projections]
            if any(needs_storage(part) for part in parts):
                module.allocate(device)
        if isinstance(module, StackedColumns):
            for name in ("weight", "bias"):
                stack = getattr(module, name)
                parts = [getattr(layer, name) for layer in module.layers]
                if stack is not None and stack.is_meta and any(needs_storage(part) for part in parts):
                    module.allocate(name, device)
    for param in model.parameters():
        if param.is_meta and needs_storage(param):
            # Not empty_like: from meta it runs a Python reference that imports sympy (~40 MiB resident).
            swap_storage(param, torch.empty(param.shape, dtype=param.dtype, device=device))
