"""Mamba-2's selective state-space scan (state-space duality) over a batch of sequences, each from its carried state.

Per head and token t, with a state `h` `[head_dim, state_size]`, a step `dt_t > 0` and the head's `A < 0`: decay
`h ← exp(dt_t A) h`, write `h ← h + dt_t x_t B_tᵀ`, then read `y_t = h C_t`. Prefill uses the chunked form (within
a chunk the outputs are a causally masked, decay-weighted `C Bᵀ` applied to `dt x`, plus the carried state read
through `C`; one state update per chunk); decode uses the token-by-token form. The `D` skip is the caller's. Everything
runs in float32, whatever the activations' dtype. These torch forms run on CPU and are the reference for CUDA's Triton
kernels (`kernels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.layers.recurrent.padded_spans import PaddedSpans, decode_only


def recurrent_ssd(
    weighted_x: torch.Tensor, log_decay: torch.Tensor, b: torch.Tensor, c: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: `weighted_x` (`dt · x`) `[seqs, heads, head_dim]`, `log_decay` (`dt · A`) `[seqs,
    heads]`, `b`, `c` `[seqs, heads, state_size]` (each head's group's), `state` `[seqs, heads, head_dim,
    state_size]`. Returns the outputs `[seqs, heads, head_dim]` and the new state."""
    state = state * log_decay.exp()[..., None, None] + weighted_x.unsqueeze(-1) * b.unsqueeze(-2)
    return torch.einsum("shpn,shn->shp", state, c), state


def chunked_ssd(
    weighted_x: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences padded to one length: `weighted_x` `[seqs, heads, tokens, head_dim]`, `log_decay` `[seqs, heads,
    tokens]`, `b`, `c` `[seqs, heads, tokens, state_size]`, `state` as in `recurrent_ssd`.

    Padding after a sequence's end must have zero inputs and log decay: it then neither decays nor writes the state.
    Returns the outputs `[seqs, heads, tokens, head_dim]` and each sequence's state after its last token.
    """
    tokens = weighted_x.shape[2]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=log_decay.device).tril()
    state = state.to(torch.float32)
    outputs = torch.empty_like(weighted_x)
    # One chunk at a time (the last may be shorter): the `[seqs, heads, chunk, chunk]` weights are the largest
    # tensor, whatever the length.
    for start in range(0, tokens, chunk):
        span = slice(start, min(start + chunk, tokens))
        length = span.stop - start
        x_i, b_i, c_i = weighted_x[:, :, span], b[:, :, span], c[:, :, span]
        # Log decay accumulated from the chunk's start through each position.
        through = torch.cumsum(log_decay[:, :, span], dim=-1)
        # How much of position j's write is left at position i (j <= i).
        gap = (through.unsqueeze(-1) - through.unsqueeze(-2)).masked_fill(~causal[:length, :length], float("-inf"))
        within = ((c_i @ b_i.transpose(-1, -2)) * gap.exp()) @ x_i
        outputs[:, :, span] = within + through.exp().unsqueeze(-1) * (c_i @ state.transpose(-1, -2))
        # Each position's write, decayed to the chunk's end.
        to_end = x_i * (through[..., -1:] - through).exp().unsqueeze(-1)
        state = state * through[..., -1].exp()[..., None, None] + to_end.transpose(-1, -2) @ b_i
    return outputs, state


def ssd_scan_spans(
    weighted_x: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan over a step's spans, flat `[tokens, heads, dim]` in the spans' order, each from its sequence's `state`:
    the token-by-token form when every span is one token, else the chunked form over the spans padded to the
    longest. Returns the outputs `[tokens, heads, head_dim]` (without the `D` skip) and the states after each span."""
    if decode_only(query_lens, weighted_x.shape[0]):
        return recurrent_ssd(weighted_x, log_decay, b, c, state)
    spans = PaddedSpans(query_lens, weighted_x.shape[0], weighted_x.device)
    pad = spans.pad
    outputs, state = chunked_ssd(pad(weighted_x), pad(log_decay), pad(b), pad(c), state, min(chunk, spans.longest))
    return spans.flatten(outputs), state
