"""A layer's routed experts held quantized, one weight per expert and projection, multiplied by the quantized GEMMs.

The step's token-expert pairs are sorted by expert as for the float stacks; each expert that received rows then runs
its gate/up weight (gate rows first), the activation, and its down weight over its run of rows, so an expert no token
chose costs nothing. Which experts received rows is read on the host once per layer: this is the CPU path, where the
quantized kernels run and a host read costs no device sync. `torch.compile` calls the dispatch as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from tandem_server.layers.moe.routing import Routing, group_by_expert


class ExpertWeight(Protocol):
    """One expert's `[out, in]` projection in some quantized format."""

    @property
    def name(self) -> str: ...

    @property
    def nbytes(self) -> int: ...

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...


class QuantizedExperts:
    """Every routed expert's `gate_up [2 * intermediate, hidden]` (ungated: `[intermediate, hidden]`) and
    `down [hidden, intermediate]` weights, this rank's features of each; `label` says what they were stored as and
    became (`Q4_0 as int4`)."""

    def __init__(self, gate_up: Sequence[ExpertWeight], down: Sequence[ExpertWeight], label: str) -> None:
        if len(gate_up) != len(down):
            raise ValueError(f"{len(gate_up)} gate/up weights for {len(down)} down weights")
        self.gate_up = list(gate_up)
        self.down = list(down)
        self.label = label
        self.nbytes = sum(weight.nbytes for weight in (*self.gate_up, *self.down))

    def dispatch(
        self, hidden: torch.Tensor, routing: Routing, activated: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """Each token's chosen experts' outputs, weighted and summed `[tokens, hidden]` (this rank's term);
        `activated` turns an expert's `gate_up` output into its down projection's input."""
        groups = group_by_expert(routing.experts, len(self.down))
        rows = hidden[groups.tokens]
        outputs = hidden.new_zeros(rows.shape[0], hidden.shape[1])
        start = 0
        for expert, end in enumerate(groups.ends.tolist()):
            if end > start:
                projected = self.gate_up[expert].linear(rows[start:end], None)
                outputs[start:end] = self.down[expert].linear(activated(projected), None)
            start = end
        outputs = outputs * routing.weights.reshape(-1)[groups.order].unsqueeze(1).to(outputs.dtype)
        return torch.zeros_like(hidden).index_add_(0, groups.tokens, outputs)

    # Eager: the dispatch itself. `keep_out_of_compiled_graphs` swaps in a version compilers step around.
    forward = dispatch


def keep_out_of_compiled_graphs() -> None:
    """Makes `torch.compile` run the experts' dispatch (a host loop over the experts that received rows) eagerly
    between graphs. Called where graphs are compiled, so a shard that never compiles never imports the compiler."""
    QuantizedExperts.forward = torch.compiler.disable(QuantizedExperts.dispatch)
