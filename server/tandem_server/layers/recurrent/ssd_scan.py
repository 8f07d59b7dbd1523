"""Mamba-2's selective state-space scan (state-space duality) over a batch of sequences, each from its carried state.

Per head and token t, with a state `h` `[head_dim, state_size]`, a step `dt_t > 0` and the head's `A < 0`: decay
`h ← exp(dt_t A) h`, write `h ← h + dt_t x_t B_tᵀ`, then read `y_t = h C_t`. Prefill uses the chunked form (within
a chunk the outputs are a causally masked, decay-weighted `C Bᵀ` applied to `dt x`, plus the carried state read
through `C`; one state update per chunk); decode uses the token-by-token form. The `D` skip is the caller's. Everything
runs in float32, whatever the activations' dtype; no fused kernel is used, on CPU or CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    pad = -tokens % chunk
    weighted_x, b, c = (F.pad(t, (0, 0, 0, pad)) for t in (weighted_x, b, c))
    # [seqs, heads, chunks, chunk, dim]
    weighted_x, b, c = (t.unflatten(2, (-1, chunk)) for t in (weighted_x, b, c))
    # Log decay accumulated from each chunk's start through each position.
    through = torch.cumsum(F.pad(log_decay, (0, pad)).unflatten(2, (-1, chunk)), dim=-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=through.device).tril()
    # How much of position j's write is left at position i of the same chunk (j <= i).
    gap = (through.unsqueeze(-1) - through.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    within = ((c @ b.transpose(-1, -2)) * gap.exp()) @ weighted_x
    read_decay = through.exp().unsqueeze(-1)
    # Each position's write, decayed to its chunk's end.
    to_end = weighted_x * (through[..., -1:] - through).exp().unsqueeze(-1)
    chunk_decay = through[..., -1].exp()[..., None, None]

    state = state.to(torch.float32)
    outputs = torch.empty_like(within)
    for i in range(weighted_x.shape[2]):
        outputs[:, :, i] = within[:, :, i] + read_decay[:, :, i] * (c[:, :, i] @ state.transpose(-1, -2))
        state = state * chunk_decay[:, :, i] + to_end[:, :, i].transpose(-1, -2) @ b[:, :, i]
    return outputs.flatten(2, 3)[:, :, :tokens], state
