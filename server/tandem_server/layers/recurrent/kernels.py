"""Where the recurrent layers' scans run: on CUDA tensors, flash-linear-attention's Triton kernels (`fla-core`), the
chunked kernel for a step with prompt chunks and the fused recurrent kernel for a step of decodes only; elsewhere, the
torch forms of `gated_delta_rule` and `ssd_scan`.

The kernels take a step's spans flat, one after another, with their boundaries (`cu_seqlens`): no span is padded to
the longest. Each span starts from its sequence's carried state and leaves the state after its last token. fla is
imported at first use, so only where a CUDA tensor reaches it (it is installed on Linux, beside Triton).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from tandem_server.layers.recurrent.gated_delta_rule import gated_delta_rule_spans
from tandem_server.layers.recurrent.ssd_scan import ssd_scan_spans


def delta_rule_spans(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a step's spans, flat `[tokens, heads, dim]` in the spans' order (queries scaled,
    queries and keys normalised, `decay` in log space), each from its sequence's `state` `[seqs, heads, key_dim,
    value_dim]`. Returns the outputs `[tokens, heads, value_dim]` and the states after each span (float32)."""
    if query.is_cuda:
        return fla_delta_rule_spans(query, key, value, decay, beta, query_lens, state)
    return gated_delta_rule_spans(query, key, value, decay, beta, query_lens, state)


def ssd_spans(
    weighted_x: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's scan over a step's spans, flat `[tokens, heads, dim]` in the spans' order, each from its sequence's
    `state` `[seqs, heads, head_dim, state_size]`; `chunk` sizes the torch form's chunks. Returns the outputs
    `[tokens, heads, head_dim]` (without the `D` skip) and the states after each span (float32)."""
    if weighted_x.is_cuda:
        return fla_ssd_spans(weighted_x, log_decay, b, c, query_lens, state)
    return ssd_scan_spans(weighted_x, log_decay, b, c, query_lens, state, chunk)


@dataclass(frozen=True)
class FlatSpans:
    """A step's spans as fla's variable-length kernels take them: boundaries on the device, and a copy on the host
    from which the chunked kernels plan their grid without reading the device."""

    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor

    @classmethod
    def of(cls, query_lens: Sequence[int], device: torch.device) -> FlatSpans:
        bounds = torch.tensor([0, *accumulate(query_lens)], dtype=torch.long)
        return cls(bounds.to(device), bounds)


def _decode_only(query_lens: Sequence[int]) -> bool:
    """Every span is one token (no span is empty)."""
    return max(query_lens) == 1


def fla_delta_rule_spans(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`delta_rule_spans` by fla's Triton kernels (scale 1: the queries come scaled)."""
    from fla.ops.gated_delta_rule import (  # noqa: PLC0415
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )

    if _decode_only(query_lens):
        # One token per sequence: a batch of sequences of length 1.
        outputs, state = fused_recurrent_gated_delta_rule(
            q=query.unsqueeze(1),
            k=key.unsqueeze(1),
            v=value.unsqueeze(1),
            g=decay.unsqueeze(1),
            beta=beta.unsqueeze(1),
            scale=1.0,
            initial_state=state,
            output_final_state=True,
        )
        return outputs.squeeze(1), state
    spans = FlatSpans.of(query_lens, query.device)
    outputs, state = chunk_gated_delta_rule(
        q=query.unsqueeze(0),
        k=key.unsqueeze(0),
        v=value.unsqueeze(0),
        g=decay.unsqueeze(0),
        beta=beta.unsqueeze(0),
        scale=1.0,
        initial_state=state,
        output_final_state=True,
        cu_seqlens=spans.cu_seqlens,
        cu_seqlens_cpu=spans.cu_seqlens_cpu,
    )
    return outputs.squeeze(0), state


def fla_ssd_spans(
    weighted_x: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    query_lens: Sequence[int],
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssd_spans` by fla's simple gated linear attention, which is the same scan with the queries `C`, the keys `B`,
    the values `dt · x` and the per-head log decay `dt · A`; its value-first state is Mamba-2's `[head_dim,
    state_size]`."""
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla  # noqa: PLC0415

    if _decode_only(query_lens):
        outputs, state = fused_recurrent_simple_gla(
            q=c.unsqueeze(1),
            k=b.unsqueeze(1),
            v=weighted_x.unsqueeze(1),
            g=log_decay.unsqueeze(1),
            scale=1.0,
            initial_state=state,
            output_final_state=True,
            state_v_first=True,
        )
        return outputs.squeeze(1), state
    spans = FlatSpans.of(query_lens, weighted_x.device)
    outputs, state = chunk_simple_gla(
        q=c.unsqueeze(0),
        k=b.unsqueeze(0),
        v=weighted_x.unsqueeze(0),
        g=log_decay.unsqueeze(0),
        scale=1.0,
        initial_state=state,
        output_final_state=True,
        state_v_first=True,
        cu_seqlens=spans.cu_seqlens,
        cu_seqlens_cpu=spans.cu_seqlens_cpu,
    )
    return outputs.squeeze(0), state
