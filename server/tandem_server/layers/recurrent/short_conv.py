"""A gated short convolution (LFM2): `out(C * conv(B * x))`, a depthwise causal convolution over a few tokens.

The state a sequence carries between steps is the convolution's last `kernel - 1` inputs `[channels, kernel - 1]`.
A step's spans are convolved together: each sequence's chunk with its carried state prepended, padded to the longest
chunk, in one depthwise `conv1d`; a decode-only step is a multiply-add over the state and the new input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


def causal_conv_chunks(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    query_lens: Sequence[int],
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal depthwise convolution of each sequence's chunk after its carried inputs.

    `inputs` `[tokens, channels]` holds the sequences' chunks in order, `query_lens` their lengths, `state`
    `[sequences, channels, kernel - 1]` the inputs before each chunk, `weight` `[channels, kernel]`. Returns the
    outputs `[tokens, channels]` and each sequence's state after its chunk.
    """
    num_seqs, carried = len(query_lens), weight.shape[-1] - 1
    if max(query_lens) == 1 and len(query_lens) == inputs.shape[0]:
        return _conv_decode(inputs, weight, bias, state)
    lens = torch.tensor(query_lens, dtype=torch.long, device=inputs.device)
    starts = torch.cumsum(lens, 0) - lens
    sequence = torch.repeat_interleave(torch.arange(num_seqs, device=inputs.device), lens, output_size=inputs.shape[0])
    column = carried + torch.arange(inputs.shape[0], device=inputs.device) - starts[sequence]
    # [sequences, carried + longest chunk, channels]: the carried inputs, then the chunk, then zero padding, which
    # only outputs past a chunk's end read.
    padded = inputs.new_zeros(num_seqs, carried + max(query_lens), inputs.shape[1])
    padded[:, :carried] = state.transpose(1, 2).to(inputs.dtype)
    padded[sequence, column] = inputs
    convolved = F.conv1d(padded.transpose(1, 2), weight.unsqueeze(1), bias, groups=weight.shape[0])
    outputs = convolved.transpose(1, 2)[sequence, column - carried]
    kept = lens.unsqueeze(1) + torch.arange(carried, device=inputs.device)
    new_state = padded[torch.arange(num_seqs, device=inputs.device).unsqueeze(1), kept].transpose(1, 2)
    return outputs, new_state


def _conv_decode(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.cat([state.to(inputs.dtype), inputs.unsqueeze(-1)], dim=-1)
    outputs = (window * weight).sum(-1)
    if bias is not None:
        outputs = outputs + bias
    return outputs, window[..., 1:]


class ShortConv(nn.Module):
    """Projections `in_proj` (B, C and x stacked) and `out_proj` around a depthwise convolution of `kernel` taps.

    Channels split across ranks: each rank convolves its share, and `out_proj` sums the shares.
    """

    def __init__(self, hidden_size: int, kernel: int, bias: bool, parallel: ParallelContext) -> None:
        super().__init__()
        self.b_proj = ColumnParallelLinear(hidden_size, hidden_size, bias, parallel)
        self.c_proj = ColumnParallelLinear(hidden_size, hidden_size, bias, parallel)
        self.x_proj = ColumnParallelLinear(hidden_size, hidden_size, bias, parallel)
        self.in_proj = StackedColumns((self.b_proj, self.c_proj, self.x_proj))
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias, parallel)
        channels = parallel.partition(hidden_size)
        self.conv_weight = sliced_parameter((len(channels), 1, kernel), CheckpointSlice.of(0, channels))
        self.conv_bias = sliced_parameter((len(channels),), CheckpointSlice.of(0, channels)) if bias else None
        self.state_shape = (len(channels), kernel - 1)

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, layer: int
    ) -> torch.Tensor:
        """The block's output for normalised `hidden`; `states.layers[layer]` holds this layer's pool (None: every
        sequence starts afresh and its state is dropped, as in warm-up)."""
        b, c, x = self.in_proj(hidden)
        weight = self.conv_weight.squeeze(1)
        if states is None:
            before = hidden.new_zeros(len(query_lens), *self.state_shape)
        else:
            before = states.layers[layer][states.slots]
        convolved, after = causal_conv_chunks(b * x, weight, self.conv_bias, query_lens, before)
        if states is not None:
            pool = states.layers[layer]
            pool[states.slots] = after.to(pool.dtype)
        return self.out_proj(c * convolved)
