"""Gated DeltaNet (Qwen3.5, Qwen3-Next): linear attention whose per-sequence state is a short convolution's last
inputs and the gated delta rule's `[value_heads, key_dim, value_dim]` memory.

Queries, keys and values pass a causal depthwise convolution (SiLU after it), queries and keys are L2-normalised,
`β = sigmoid(b)` and the log decay `g = -exp(A_log) · softplus(a + dt_bias)` come from their own projections; the
delta rule's output goes through an RMSNorm gated by `silu(z)` per value head, then the output projection. Each key
head serves `value_heads / key_heads` consecutive value heads. Ranks split the key heads, with their value heads and
the convolution's channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.norm import GatedRMSNorm
from tandem_server.layers.recurrent.gated_delta_rule import l2_normalise
from tandem_server.layers.recurrent.kernels import delta_rule_spans
from tandem_server.layers.recurrent.short_conv import causal_conv_chunks
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.weights.layout import FusedTensor
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


@dataclass(frozen=True)
class DeltaNetArgs:
    """The linear-attention sizes config.json gives (`linear_*`)."""

    hidden_size: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    rms_norm_eps: float
    # Qwen3-Next's layout: `in_proj_qkvz` holds each key head's query, key, values and gates together, `in_proj_ba`
    # each key head's b and a; else (Qwen3.5) `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a`.
    grouped_projections: bool = False

    @classmethod
    def from_hf(cls, hf: dict[str, Any], grouped_projections: bool = False) -> DeltaNetArgs:
        args = cls(
            hidden_size=int(hf["hidden_size"]),
            num_key_heads=int(hf.get("linear_num_key_heads", 16)),
            num_value_heads=int(hf.get("linear_num_value_heads", 32)),
            key_head_dim=int(hf.get("linear_key_head_dim", 128)),
            value_head_dim=int(hf.get("linear_value_head_dim", 128)),
            conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            grouped_projections=grouped_projections,
        )
        if args.num_value_heads % args.num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads ({args.num_value_heads}) must be a multiple of linear_num_key_heads "
                f"({args.num_key_heads})"
            )
        if args.conv_kernel < 2:
            raise ConfigError(f"linear_conv_kernel_dim is {args.conv_kernel}; the convolution needs at least 2 taps")
        return args

    @property
    def key_size(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_size(self) -> int:
        return self.num_value_heads * self.value_head_dim

    def fused_tensors(self, prefix: str) -> tuple[FusedTensor, ...]:
        """The checkpoint's stacked convolution (and Qwen3.5's stacked query/key/value projection), split into the
        parts ranks slice."""
        sizes = (("q", self.key_size), ("k", self.key_size), ("v", self.value_size))
        conv = FusedTensor(f"{prefix}.conv1d.weight", tuple((f"{prefix}.conv_{p}", n) for p, n in sizes))
        if self.grouped_projections:
            return (conv,)
        parts = tuple((f"{prefix}.{p}_proj.weight", n) for p, n in sizes)
        return FusedTensor(f"{prefix}.in_proj_qkv.weight", parts), conv


def _scaled(run: range, size: int) -> range:
    return range(run.start * size, run.stop * size)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet block over normalised hidden states; parameter names follow the checkpoint's
    `linear_attn.*` (the stacked `conv1d`, and Qwen3.5's `in_proj_qkv`, split by `DeltaNetArgs.fused_tensors`)."""

    def __init__(self, args: DeltaNetArgs, parallel: ParallelContext) -> None:
        super().__init__()
        key_heads = parallel.partition(args.num_key_heads)
        if not key_heads:
            raise ConfigError(
                f"{parallel.world_size} shards but the linear attention has {args.num_key_heads} key heads; "
                f"use at most {args.num_key_heads} shards"
            )
        group = args.num_value_heads // args.num_key_heads
        value_heads = range(key_heads.start * group, key_heads.stop * group)
        self.args, self.num_key_heads, self.num_value_heads = args, len(key_heads), len(value_heads)
        keys, values = _scaled(key_heads, args.key_head_dim), _scaled(value_heads, args.value_head_dim)
        self.projections = self._build_projections(parallel, key_heads)
        kernel = args.conv_kernel
        self.conv_q = sliced_parameter((len(keys), 1, kernel), CheckpointSlice.of(0, keys))
        self.conv_k = sliced_parameter((len(keys), 1, kernel), CheckpointSlice.of(0, keys))
        self.conv_v = sliced_parameter((len(values), 1, kernel), CheckpointSlice.of(0, values))
        self.dt_bias = sliced_parameter((len(value_heads),), CheckpointSlice.of(0, value_heads))
        self.A_log = sliced_parameter((len(value_heads),), CheckpointSlice.of(0, value_heads))
        self.norm = GatedRMSNorm(args.value_head_dim, args.rms_norm_eps)
        self.out_proj = RowParallelLinear(args.value_size, args.hidden_size, False, parallel, values)
        self.split_sizes = (len(keys), len(keys), len(values))
        channels = sum(self.split_sizes)
        # The convolution's last inputs (model dtype) and the delta rule's memory (float32).
        self.state_shapes = ((channels, kernel - 1), (len(value_heads), args.key_head_dim, args.value_head_dim))
        self.state_dtypes = (None, torch.float32)

    def _build_projections(self, parallel: ParallelContext, key_heads: range) -> StackedColumns:
        args, hidden = self.args, self.args.hidden_size
        group = args.num_value_heads // args.num_key_heads
        if args.grouped_projections:
            per_key_head = 2 * args.key_head_dim + 2 * group * args.value_head_dim
            qkvz_rows = _scaled(key_heads, per_key_head)
            self.in_proj_qkvz = ColumnParallelLinear(
                hidden, args.num_key_heads * per_key_head, False, parallel, qkvz_rows
            )
            ba_rows = _scaled(key_heads, 2 * group)
            self.in_proj_ba = ColumnParallelLinear(hidden, 2 * args.num_value_heads, False, parallel, ba_rows)
            return StackedColumns((self.in_proj_qkvz, self.in_proj_ba))
        keys, values = _scaled(key_heads, args.key_head_dim), _scaled(key_heads, group * args.value_head_dim)
        value_heads = _scaled(key_heads, group)
        self.q_proj = ColumnParallelLinear(hidden, args.key_size, False, parallel, keys)
        self.k_proj = ColumnParallelLinear(hidden, args.key_size, False, parallel, keys)
        self.v_proj = ColumnParallelLinear(hidden, args.value_size, False, parallel, values)
        self.in_proj_z = ColumnParallelLinear(hidden, args.value_size, False, parallel, values)
        self.in_proj_b = ColumnParallelLinear(hidden, args.num_value_heads, False, parallel, value_heads)
        self.in_proj_a = ColumnParallelLinear(hidden, args.num_value_heads, False, parallel, value_heads)
        return StackedColumns((self.q_proj, self.k_proj, self.v_proj, self.in_proj_z, self.in_proj_b, self.in_proj_a))

    def _project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's queries, keys, values, gates `z`, `b` and `a`, each `[tokens, features]` in head order."""
        if not self.args.grouped_projections:
            return self.projections(hidden)
        qkvz, ba = self.projections(hidden)
        tokens, group = hidden.shape[0], self.num_value_heads // self.num_key_heads
        key_dim, values = self.args.key_head_dim, group * self.args.value_head_dim
        query, key, value, z = qkvz.view(tokens, self.num_key_heads, -1).split((key_dim, key_dim, values, values), -1)
        b, a = ba.view(tokens, self.num_key_heads, -1).split((group, group), dim=-1)
        return tuple(x.reshape(tokens, -1) for x in (query, key, value, z, b, a))

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, layer: int
    ) -> torch.Tensor:
        """The block's output for normalised `hidden`; `states.layers[layer]` and `[layer + 1]` hold this layer's
        convolution and delta-rule pools (None: every sequence starts afresh and its state is dropped)."""
        tokens, num_seqs = hidden.shape[0], len(query_lens)
        query, key, value, z, b, a = self._project(hidden)
        if states is None:
            conv_before = hidden.new_zeros(num_seqs, *self.state_shapes[0])
            memory_before = hidden.new_zeros(num_seqs, *self.state_shapes[1], dtype=torch.float32)
        else:
            conv_before, memory_before = states.layers[layer][states.slots], states.layers[layer + 1][states.slots]
        weight = torch.cat((self.conv_q, self.conv_k, self.conv_v)).squeeze(1)
        mixed = torch.cat((query, key, value), dim=-1)
        convolved, conv_after = causal_conv_chunks(mixed, weight, None, query_lens, conv_before)
        query, key, value = F.silu(convolved).split(self.split_sizes, dim=-1)

        args, group = self.args, self.num_value_heads // self.num_key_heads
        query = l2_normalise(query.view(tokens, self.num_key_heads, -1).float()) * args.key_head_dim**-0.5
        key = l2_normalise(key.view(tokens, self.num_key_heads, -1).float())
        query, key = query.repeat_interleave(group, dim=1), key.repeat_interleave(group, dim=1)
        value = value.view(tokens, self.num_value_heads, -1).float()
        beta = b.sigmoid().float()
        decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        attended, memory_after = delta_rule_spans(query, key, value, decay, beta, query_lens, memory_before)

        if states is not None:
            states.layers[layer][states.slots] = conv_after.to(states.layers[layer].dtype)
            states.layers[layer + 1][states.slots] = memory_after
        gated = self.norm(attended.to(hidden.dtype), z.view(tokens, self.num_value_heads, -1))
        return self.out_proj(gated.reshape(tokens, -1))
