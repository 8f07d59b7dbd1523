"""The gated delta rule (Gated DeltaNet's linear attention) over a batch of sequences, each from its carried state.

Per head and token t, with a state `S` `[key_dim, value_dim]`: decay `S ← exp(g_t) S`, correct what the state
predicts for the key, `S ← S + β_t k_t (v_t - k_tᵀ S)ᵀ`, then read `o_t = q_tᵀ S`. Prefill uses the chunked form (a
triangular solve per chunk, then one state update per chunk); decode uses the token-by-token form. Everything runs
in float32, whatever the activations' dtype. These torch forms run on CPU and are the reference for CUDA's Triton
kernels (`kernels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from tandem_server.layers.recurrent.padded_spans import PaddedSpans, decode_only

DELTA_RULE_CHUNK = 64
L2_NORM_EPS = 1e-6


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """`x / sqrt(|x|² + eps)` over the last dimension (the epsilon inside the root, as the reference kernels)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: `query`, `key` `[seqs, heads, key_dim]` (normalised and scaled), `value`
    `[seqs, heads, value_dim]`, `decay` (log space) and `beta` `[seqs, heads]`, `state` `[seqs, heads, key_dim,
    value_dim]`. Returns the outputs `[seqs, heads, value_dim]` and the new state."""
    state = state * decay.exp()[..., None, None]
    predicted = torch.einsum("shk,shkv->shv", key, state)
    correction = (value - predicted) * beta.unsqueeze(-1)
    state = state + key.unsqueeze(-1) * correction.unsqueeze(-2)
    return torch.einsum("shk,shkv->shv", query, state), state


def chunked_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = DELTA_RULE_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences padded to one length: `query`, `key` `[seqs, heads, tokens, key_dim]`, `value` `[seqs, heads, tokens,
    value_dim]`, `decay`, `beta` `[seqs, heads, tokens]`, `state` as in `recurrent_gated_delta_rule`.

    Padding after a sequence's end must have zero keys and values and zero decay: it then leaves the state unchanged.
    Returns the outputs `[seqs, heads, tokens, value_dim]` and each sequence's state after its last token.
    """
    tokens = query.shape[2]
    pad = -tokens % chunk
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    decay, beta = (F.pad(x, (0, pad)) for x in (decay, beta))
    # [seqs, heads, chunks, chunk, dim]
    query, key, value = (x.unflatten(2, (-1, chunk)) for x in (query, key, value))
    decay, beta = decay.unflatten(2, (-1, chunk)), beta.unflatten(2, (-1, chunk))

    # Log decay from the chunk's start through each position, and between each pair of positions (i after j).
    through = decay.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).tril()
    between = (through.unsqueeze(-1) - through.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()

    weighted_key = key * beta.unsqueeze(-1)
    # The delta rule within a chunk is the unit lower-triangular system (I + L) U = β V, where L[i, j] (j < i) is how
    # much position j's write shows in position i's prediction: solved once for the values and for the keys that read
    # the state carried into the chunk.
    system = (weighted_key @ key.transpose(-1, -2)) * between
    corrections = torch.linalg.solve_triangular(system, value * beta.unsqueeze(-1), upper=False, unitriangular=True)
    state_readers = torch.linalg.solve_triangular(
        system, weighted_key * through.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    within = (query @ key.transpose(-1, -2)) * between
    decayed_query = query * through.exp().unsqueeze(-1)
    # Each key's write, decayed to the chunk's end.
    to_end = through[..., -1:] - through
    decayed_key = key * to_end.exp().unsqueeze(-1)
    chunk_decay = through[..., -1].exp()[..., None, None]

    state = state.to(torch.float32)
    outputs = torch.empty_like(corrections)
    for i in range(query.shape[2]):
        written = corrections[:, :, i] - state_readers[:, :, i] @ state
        outputs[:, :, i] = decayed_query[:, :, i] @ state + within[:, :, i] @ written
        state = state * chunk_decay[:, :, i] + decayed_key[:, :, i].transpose(-1, -2) @ written
    return outputs.flatten(2, 3)[:, :, :tokens], state


def gated_delta_rule_spans(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a step's spans, flat `[tokens, heads, dim]` in the spans' order, each from its
    sequence's `state`: the token-by-token form when every span is one token, else the chunked form over the spans
    padded to the longest. Returns the outputs `[tokens, heads, value_dim]` and the states after each span."""
    if decode_only(query_lens, query.shape[0]):
        return recurrent_gated_delta_rule(query, key, value, decay, beta, state)
    spans = PaddedSpans(query_lens, query.shape[0], query.device)
    pad = spans.pad
    outputs, state = chunked_gated_delta_rule(pad(query), pad(key), pad(value), pad(decay), pad(beta), state)
    return spans.flatten(outputs), state
