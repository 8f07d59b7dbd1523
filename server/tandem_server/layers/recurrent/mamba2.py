"""Mamba-2 (Granite 4.0-H, Nemotron-H): a selective state-space layer whose per-sequence state is a short
convolution's last inputs and the scan's `[heads, head_dim, state_size]` memory.

`in_proj` gives the gate `z`, the convolution's channels `xBC` and each head's step `dt`. `xBC` passes a causal
depthwise convolution (with bias, SiLU after it) and splits into the heads' inputs `x` and the groups' `B` and `C`
(each group serves `heads / n_groups` consecutive heads); `dt = clamp(softplus(dt + dt_bias), time_step_limit)`,
`A = -exp(A_log)`. The scan's output plus `D · x` goes through an RMSNorm of `y · silu(z)` per group, then `out_proj`.
Ranks split the heads (`Mamba2Shard`); a group whose heads lie on several ranks is normalised over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.recurrent.kernels import ssd_spans
from tandem_server.layers.recurrent.mamba2_shard import Mamba2GatedNorm, Mamba2Shard
from tandem_server.layers.recurrent.short_conv import causal_conv_chunks
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.weights.layout import FusedTensor
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter

DEFAULT_CHUNK_SIZE = 256


@dataclass(frozen=True)
class Mamba2Args:
    """The state-space sizes config.json gives (`mamba_*`)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    num_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool
    rms_norm_eps: float
    time_step_limit: tuple[float, float] = (0.0, math.inf)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Mamba2Args:
        hidden, heads = int(hf["hidden_size"]), int(hf.get("mamba_n_heads", 128))
        intermediate = int(hf.get("mamba_expand", 2)) * hidden
        head_dim = hf.get("mamba_d_head", "auto")
        limit = hf.get("time_step_limit") or (0.0, math.inf)
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            head_dim=intermediate // heads if head_dim in (None, "auto") else int(head_dim),
            num_groups=int(hf.get("mamba_n_groups", 1)),
            state_size=int(hf.get("mamba_d_state", 256)),
            conv_kernel=int(hf.get("mamba_d_conv", 4)),
            chunk_size=int(hf.get("mamba_chunk_size") or DEFAULT_CHUNK_SIZE),
            conv_bias=bool(hf.get("mamba_conv_bias", True)),
            proj_bias=bool(hf.get("mamba_proj_bias", False)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            time_step_limit=(_json_float(limit[0]), _json_float(limit[1])),
        ).checked(intermediate, "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_conv")

    @classmethod
    def from_nemotron_h(cls, hf: dict[str, Any]) -> Mamba2Args:
        """Nemotron-H's spelling of the same sizes (`mamba_num_heads`, `n_groups`, `ssm_state_size`, ...); one bias
        (`use_bias`) serves both projections. The step is clamped below at `time_step_min`, as the reference's
        chunked scan does (its `time_step_limit` is not read; its token-by-token update clamps nothing)."""
        hidden, heads = int(hf["hidden_size"]), int(hf.get("mamba_num_heads", 128))
        limit = (hf.get("time_step_min", 0.001), math.inf)
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            head_dim=int(hf.get("mamba_head_dim", 64)),
            num_groups=int(hf.get("n_groups", 8)),
            state_size=int(hf.get("ssm_state_size", 128)),
            conv_kernel=int(hf.get("conv_kernel", 4)),
            chunk_size=int(hf.get("chunk_size") or DEFAULT_CHUNK_SIZE),
            conv_bias=bool(hf.get("use_conv_bias", True)),
            proj_bias=bool(hf.get("use_bias", False)),
            rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            time_step_limit=(_json_float(limit[0]), _json_float(limit[1])),
        ).checked(None, "mamba_num_heads", "mamba_head_dim", "n_groups", "conv_kernel")

    def checked(
        self, intermediate: int | None, heads_key: str, head_dim_key: str, groups_key: str, conv_key: str
    ) -> Mamba2Args:
        """These sizes, or a ConfigError naming the config.json keys that disagree (`intermediate`: the width the heads
        must fill, where the config fixes one)."""
        if intermediate is not None and self.intermediate_size != intermediate:
            raise ConfigError(
                f"{heads_key} ({self.num_heads}) times {head_dim_key} ({self.head_dim}) must equal mamba_expand * "
                f"hidden_size ({intermediate})"
            )
        if self.num_heads % self.num_groups:
            raise ConfigError(f"{heads_key} ({self.num_heads}) must be a multiple of {groups_key} ({self.num_groups})")
        if self.conv_kernel < 2:
            raise ConfigError(f"{conv_key} is {self.conv_kernel}; the convolution needs at least 2 taps")
        return self

    def fused_tensors(self, prefix: str) -> tuple[FusedTensor, ...]:
        """The checkpoint's stacked `in_proj` (`z`, `x`, `B`, `C`, `dt`) and `conv1d` (`x`, `B`, `C`), split into the
        parts ranks slice."""
        groups = self.num_groups * self.state_size
        channels = (("x", self.intermediate_size), ("b", groups), ("c", groups))
        rows = (("z", self.intermediate_size), *channels, ("dt", self.num_heads))
        fused = [FusedTensor(f"{prefix}.in_proj.weight", tuple((f"{prefix}.{p}_proj.weight", n) for p, n in rows))]
        if self.proj_bias:
            fused.append(FusedTensor(f"{prefix}.in_proj.bias", tuple((f"{prefix}.{p}_proj.bias", n) for p, n in rows)))
        kinds = ("weight", "bias") if self.conv_bias else ("weight",)
        for kind in kinds:
            parts = tuple((f"{prefix}.conv_{p}_{kind}", n) for p, n in channels)
            fused.append(FusedTensor(f"{prefix}.conv1d.{kind}", parts))
        return tuple(fused)

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim


def _json_float(value: Any) -> float:
    """A number of config.json, where transformers writes infinity as `{"__float__": "Infinity"}`."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


class Mamba2Mixer(nn.Module):
    """One Mamba-2 block over normalised hidden states; parameter names follow the checkpoint's `mamba.*` (its
    `in_proj` and `conv1d` split by `Mamba2Args.fused_tensors`)."""

    def __init__(self, args: Mamba2Args, parallel: ParallelContext) -> None:
        super().__init__()
        self.args = args
        self.shard = shard = Mamba2Shard.of(args.num_heads, args.num_groups, parallel)
        heads, features = shard.heads, shard.head_features(args.head_dim)
        groups = shard.group_features(args.state_size)
        self.projections = self._build_projections(parallel, features, groups)
        kernel = args.conv_kernel
        self.conv_x_weight, self.conv_x_bias = _depthwise_taps(features, kernel, args.conv_bias)
        self.conv_b_weight, self.conv_b_bias = _depthwise_taps(groups, kernel, args.conv_bias)
        self.conv_c_weight, self.conv_c_bias = _depthwise_taps(groups, kernel, args.conv_bias)
        self.dt_bias = sliced_parameter((len(heads),), CheckpointSlice.of(0, heads))
        self.A_log = sliced_parameter((len(heads),), CheckpointSlice.of(0, heads))
        self.D = sliced_parameter((len(heads),), CheckpointSlice.of(0, heads))
        self.norm = Mamba2GatedNorm(shard, args.head_dim, args.rms_norm_eps, parallel)
        self.out_proj = RowParallelLinear(args.intermediate_size, args.hidden_size, args.proj_bias, parallel, features)
        self.split_sizes = (len(features), len(groups), len(groups))
        # The convolution's last inputs (model dtype) and the scan's memory (float32), of this rank's heads and groups.
        self.state_shapes = ((sum(self.split_sizes), kernel - 1), (len(heads), args.head_dim, args.state_size))
        self.state_dtypes = (None, torch.float32)

    def _build_projections(self, parallel: ParallelContext, features: range, groups: range) -> StackedColumns:
        args, hidden, bias = self.args, self.args.hidden_size, self.args.proj_bias
        group_rows = args.num_groups * args.state_size
        self.z_proj = ColumnParallelLinear(hidden, args.intermediate_size, bias, parallel, features)
        self.x_proj = ColumnParallelLinear(hidden, args.intermediate_size, bias, parallel, features)
        self.b_proj = ColumnParallelLinear(hidden, group_rows, bias, parallel, groups)
        self.c_proj = ColumnParallelLinear(hidden, group_rows, bias, parallel, groups)
        self.dt_proj = ColumnParallelLinear(hidden, args.num_heads, bias, parallel, self.shard.heads)
        return StackedColumns((self.z_proj, self.x_proj, self.b_proj, self.c_proj, self.dt_proj))

    def _conv_taps(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The convolution's weight `[channels, kernel]` and bias over this rank's `x`, `B` and `C` channels."""
        weight = torch.cat((self.conv_x_weight, self.conv_b_weight, self.conv_c_weight)).squeeze(1)
        if self.conv_x_bias is None or self.conv_b_bias is None or self.conv_c_bias is None:
            return weight, None
        return weight, torch.cat((self.conv_x_bias, self.conv_b_bias, self.conv_c_bias))

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, layer: int
    ) -> torch.Tensor:
        """The block's output for normalised `hidden`; `states.layers[layer]` and `[layer + 1]` hold this layer's
        convolution and scan pools (None: every sequence starts afresh and its state is dropped)."""
        args, shard, tokens, num_seqs = self.args, self.shard, hidden.shape[0], len(query_lens)
        # The stack's rows are z, then x, B and C side by side as the convolution takes them, then dt.
        projected = self.projections.gemm(hidden, self.projections.bias)
        heads = len(shard.heads)
        z, xbc, dt = projected.split((heads * args.head_dim, sum(self.split_sizes), heads), dim=-1)
        if states is None:
            conv_before = hidden.new_zeros(num_seqs, *self.state_shapes[0])
            memory_before = hidden.new_zeros(num_seqs, *self.state_shapes[1], dtype=torch.float32)
        else:
            conv_before, memory_before = states.layers[layer][states.slots], states.layers[layer + 1][states.slots]
        weight, bias = self._conv_taps()
        convolved, conv_after = causal_conv_chunks(xbc, weight, bias, query_lens, conv_before)
        x, b, c = F.silu(convolved).float().split(self.split_sizes, dim=-1)
        x = x.view(tokens, heads, args.head_dim)
        b, c = (shard.per_head(t.view(tokens, len(shard.groups), -1)) for t in (b, c))
        step = F.softplus(dt.float() + self.dt_bias.float()).clamp(*args.time_step_limit)
        log_decay = step * -self.A_log.float().exp()
        weighted_x = x * step.unsqueeze(-1)
        scanned, memory_after = ssd_spans(weighted_x, log_decay, b, c, query_lens, memory_before, args.chunk_size)
        if states is not None:
            states.layers[layer][states.slots] = conv_after.to(states.layers[layer].dtype)
            states.layers[layer + 1][states.slots] = memory_after
        scanned = scanned + x * self.D.float()[:, None]
        gated = self.norm(scanned.reshape(tokens, -1), z)
        return self.out_proj(gated.to(hidden.dtype))


def _depthwise_taps(rows: range, kernel: int, bias: bool) -> tuple[nn.Parameter, nn.Parameter | None]:
    """A depthwise convolution's weight `[rows, 1, kernel]` and bias (where it has one) over checkpoint rows `rows`."""
    checkpoint_rows = CheckpointSlice.of(0, rows)
    weight = sliced_parameter((len(rows), 1, kernel), checkpoint_rows)
    return weight, sliced_parameter((len(rows),), checkpoint_rows) if bias else None
