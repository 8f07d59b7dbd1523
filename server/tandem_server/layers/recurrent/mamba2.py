"""Mamba-2 (Granite 4.0-H, Nemotron-H): a selective state-space layer whose per-sequence state is a short
convolution's last inputs and the scan's `[heads, head_dim, state_size]` memory.

`in_proj` gives the gate `z`, the convolution's channels `xBC` and each head's step `dt`. `xBC` passes a causal
depthwise convolution (with bias, SiLU after it) and splits into the heads' inputs `x` and the groups' `B` and `C`
(each group serves `heads / n_groups` consecutive heads); `dt = clamp(softplus(dt + dt_bias), time_step_limit)`,
`A = -exp(A_log)`. The scan's output plus `D · x` goes through an RMSNorm of `y · silu(z)` per group, then `out_proj`.
The norm spans every head of a group (Granite's published checkpoints have one group), so the layer runs on one rank.
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
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear
from tandem_server.layers.norm import GroupedGatedRMSNorm
from tandem_server.layers.recurrent.kernels import ssd_spans
from tandem_server.layers.recurrent.short_conv import causal_conv_chunks
from tandem_server.layers.recurrent.state_pool import StepStates
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

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """`x`, then every group's `B`, then every group's `C`."""
        return self.intermediate_size + 2 * self.num_groups * self.state_size


def _json_float(value: Any) -> float:
    """A number of config.json, where transformers writes infinity as `{"__float__": "Infinity"}`."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


class Mamba2Mixer(nn.Module):
    """One Mamba-2 block over normalised hidden states; parameter names follow the checkpoint's `mamba.*` (its
    `conv1d.weight` and `conv1d.bias` are loaded as `conv_weight` and `conv_bias`)."""

    def __init__(self, args: Mamba2Args, parallel: ParallelContext) -> None:
        super().__init__()
        if parallel.world_size > 1:
            raise ConfigError(
                f"Mamba-2 layers run on one shard (this group has {parallel.world_size}): their gated norm spans all "
                "heads of a group, and the published checkpoints have one group; serve with --num-shard 1"
            )
        self.args = args
        channels, heads = args.conv_channels, args.num_heads
        self.in_proj = ColumnParallelLinear(
            args.hidden_size, args.intermediate_size + channels + heads, args.proj_bias, parallel
        )
        self.conv_weight = sliced_parameter((channels, 1, args.conv_kernel), CheckpointSlice.of(0, range(channels)))
        self.conv_bias = (
            sliced_parameter((channels,), CheckpointSlice.of(0, range(channels))) if args.conv_bias else None
        )
        self.dt_bias = sliced_parameter((heads,), CheckpointSlice.of(0, range(heads)))
        self.A_log = sliced_parameter((heads,), CheckpointSlice.of(0, range(heads)))
        self.D = sliced_parameter((heads,), CheckpointSlice.of(0, range(heads)))
        self.norm = GroupedGatedRMSNorm(args.intermediate_size, args.num_groups, args.rms_norm_eps)
        self.out_proj = RowParallelLinear(args.intermediate_size, args.hidden_size, args.proj_bias, parallel)
        # The convolution's last inputs (model dtype) and the scan's memory (float32).
        self.state_shapes = ((channels, args.conv_kernel - 1), (heads, args.head_dim, args.state_size))
        self.state_dtypes = (None, torch.float32)

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, layer: int
    ) -> torch.Tensor:
        """The block's output for normalised `hidden`; `states.layers[layer]` and `[layer + 1]` hold this layer's
        convolution and scan pools (None: every sequence starts afresh and its state is dropped)."""
        args, tokens, num_seqs = self.args, hidden.shape[0], len(query_lens)
        z, xbc, dt = self.in_proj(hidden).split((args.intermediate_size, args.conv_channels, args.num_heads), -1)
        if states is None:
            conv_before = hidden.new_zeros(num_seqs, *self.state_shapes[0])
            memory_before = hidden.new_zeros(num_seqs, *self.state_shapes[1], dtype=torch.float32)
        else:
            conv_before, memory_before = states.layers[layer][states.slots], states.layers[layer + 1][states.slots]
        convolved, conv_after = causal_conv_chunks(
            xbc, self.conv_weight.squeeze(1), self.conv_bias, query_lens, conv_before
        )
        groups = args.num_groups * args.state_size
        x, b, c = F.silu(convolved).float().split((args.intermediate_size, groups, groups), dim=-1)
        x = x.view(tokens, args.num_heads, args.head_dim)
        per_group = args.num_heads // args.num_groups
        b, c = (t.view(tokens, args.num_groups, -1).repeat_interleave(per_group, dim=1) for t in (b, c))
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
