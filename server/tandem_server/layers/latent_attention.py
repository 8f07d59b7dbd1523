"""Multi-head latent attention (MLA, DeepSeek-V2/V3 and Kimi K2) over a paged cache of compressed latents.

Each token's keys and values are compressed into one `kv_lora_rank`-wide latent (normalised), beside one rotary key
`qk_rope_head_dim` wide that every head shares; the cache keeps only those two per token and layer. `kv_b_proj`
expands a latent into each head's key part without rotation (`qk_nope_head_dim`) and its value (`v_head_dim`).

- Prompt chunks run the expanded form: the context's latents are expanded into per-head keys and values and every
  head attends as usual (fewer operations when many queries share the context).
- Decode rows run the absorbed form: each head's query is multiplied into latent space by its key expansion (W_UK),
  attends over the cached rows as multi-query attention (the latent and rotary key are the one key head, the latent
  alone the value; the backend's kernel, `AbsorbedDecoding`), and the attended latent is expanded by its value
  expansion (W_UV) afterwards. Nothing per head is ever built for the context.

Both forms give the same scores: `q_nope · (W_UK c) = (q_nope W_UK) · c`. Tensor parallelism splits the heads (their
rows of the query, `kv_b_proj` and `o_proj`) and keeps the latent projections whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.attention.latent_step import AbsorbedDecoding
from tandem_server.layers.attention.metadata import AttentionMetadata
from tandem_server.layers.attention.torch_metadata import PrefillSpan
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, rank_run
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rotary import RotaryAngles

# The latent norms' epsilon: the reference builds them with its RMSNorm default, not the model's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class LatentAttentionArgs:
    """The sizes and options of one MLA layer, read from config.json."""

    hidden_size: int
    num_heads: int
    # None: queries come straight from `q_proj`, without a compressed query.
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # `attention_bias`: on q_a_proj, kv_a_proj_with_mqa and o_proj.
    bias: bool
    # The softmax scale (YaRN's mscale already applied).
    scale: float

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_dim(self) -> int:
        """Features one token keeps in the cache per layer: the latent then the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class LatentAttention(nn.Module):
    """One MLA layer's projections and attention; parameter names follow the checkpoint's `self_attn.*`."""

    def __init__(self, args: LatentAttentionArgs, parallel: ParallelContext) -> None:
        super().__init__()
        self.args = args
        heads = rank_run(None, args.num_heads, parallel, "attention heads")
        self.num_heads = len(heads)

        def features(width: int) -> range:
            return range(heads.start * width, heads.stop * width)

        query_size, query_rows = args.num_heads * args.qk_head_dim, features(args.qk_head_dim)
        if args.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(args.hidden_size, query_size, False, parallel, query_rows)
        else:
            rank = args.q_lora_rank
            # The compressed query is whole on every rank (its output range is all of it).
            self.q_a_proj = ColumnParallelLinear(args.hidden_size, rank, args.bias, parallel, range(rank))
            self.q_a_layernorm = RMSNorm(rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(rank, query_size, False, parallel, query_rows)
        self.kv_a_proj_with_mqa = ColumnParallelLinear(
            args.hidden_size, args.cache_dim, args.bias, parallel, range(args.cache_dim)
        )
        self.kv_a_layernorm = RMSNorm(args.kv_lora_rank, LATENT_NORM_EPS)
        expanded = args.qk_nope_head_dim + args.v_head_dim
        self.kv_b_proj = ColumnParallelLinear(
            args.kv_lora_rank, args.num_heads * expanded, False, parallel, features(expanded)
        )
        self.o_proj = RowParallelLinear(
            args.num_heads * args.v_head_dim, args.hidden_size, args.bias, parallel, features(args.v_head_dim)
        )

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: RotaryAngles,
        cache: LatentLayerCache,
        metadata: AttentionMetadata,
        backend: AbsorbedDecoding,
    ) -> torch.Tensor:
        """The attention output `[tokens, hidden]` of normalised `hidden`; the step's latents and rotary keys land in
        `cache` at their slots first, so every row attends to its own token too."""
        args = self.args
        tokens = hidden.shape[0]
        query = self._queries(hidden).view(tokens, self.num_heads, args.qk_head_dim)
        query_nope, query_rope = query.split([args.qk_nope_head_dim, args.qk_rope_head_dim], dim=-1)
        query_rope = rotation.rotate(query_rope)
        latent, key_rope = self.kv_a_proj_with_mqa(hidden).split([args.kv_lora_rank, args.qk_rope_head_dim], dim=-1)
        rows = torch.cat((self.kv_a_layernorm(latent), rotation.rotate(key_rope.unsqueeze(1)).squeeze(1)), dim=-1)
        slots = cache.flat_rows()
        slots.index_copy_(0, metadata.slot_mapping, rows.to(slots.dtype))

        layout = backend.latent_layout(metadata)
        decode_rows = layout.decode_rows
        if isinstance(decode_rows, slice):
            # Every row of the step decodes.
            attended = self._absorbed(query_nope, query_rope, cache, metadata, backend)
            return self.o_proj(attended.reshape(tokens, self.num_heads * args.v_head_dim))
        attended = hidden.new_empty(tokens, self.num_heads, args.v_head_dim)
        for span in layout.prefills:
            taken = slice(span.query_start, span.query_start + span.query_len)
            attended[taken] = self._expanded(query_nope[taken], query_rope[taken], slots, span)
        if decode_rows is not None:
            absorbed = self._absorbed(query_nope[decode_rows], query_rope[decode_rows], cache, metadata, backend)
            attended[decode_rows] = absorbed
        return self.o_proj(attended.reshape(tokens, self.num_heads * args.v_head_dim))

    def _queries(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.args.q_lora_rank is None:
            return self.q_proj(hidden)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))

    def _expanded(
        self, query_nope: torch.Tensor, query_rope: torch.Tensor, slots: torch.Tensor, span: PrefillSpan
    ) -> torch.Tensor:
        """A prompt chunk's heads `[queries, heads, v_head_dim]`, attending to per-head keys and values expanded from
        its context's cached rows."""
        args = self.args
        context = slots[span.key_slots].to(query_nope.dtype)
        latent, key_rope = context.split([args.kv_lora_rank, args.qk_rope_head_dim], dim=-1)
        expanded = self.kv_b_proj(latent).view(context.shape[0], self.num_heads, -1)
        key_nope, value = expanded.split([args.qk_nope_head_dim, args.v_head_dim], dim=-1)
        key = torch.cat((key_nope, key_rope.unsqueeze(1).expand(-1, self.num_heads, -1)), dim=-1)
        query = torch.cat((query_nope, query_rope), dim=-1)
        attended = F.scaled_dot_product_attention(
            query.transpose(0, 1).unsqueeze(0),
            key.transpose(0, 1).unsqueeze(0),
            value.transpose(0, 1).unsqueeze(0),
            attn_mask=span.mask,
            is_causal=span.mask is None,
            scale=args.scale,
        )
        return attended[0].transpose(0, 1)

    def _absorbed(
        self,
        query_nope: torch.Tensor,
        query_rope: torch.Tensor,
        cache: LatentLayerCache,
        metadata: AttentionMetadata,
        backend: AbsorbedDecoding,
    ) -> torch.Tensor:
        """Decode rows' heads `[requests, heads, v_head_dim]`: queries multiplied into latent space attend over the
        cached rows through the backend, and the attended latents are expanded into values."""
        args = self.args
        expansion = self.kv_b_proj.weight.view(self.num_heads, -1, args.kv_lora_rank)
        key_expansion, value_expansion = expansion.split([args.qk_nope_head_dim, args.v_head_dim], dim=1)
        query_latent = torch.einsum("rhn,hnl->rhl", query_nope, key_expansion)
        query = torch.cat((query_latent, query_rope), dim=-1)
        attended_latent = backend.absorbed_decode(query, cache, metadata, args.scale)
        return torch.einsum("rhl,hvl->rhv", attended_latent, value_expansion)
