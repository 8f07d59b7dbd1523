"""The decoder-only transformer every family is composed from; a family file only reads its config into DecoderArgs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.interfaces.context import served_positions
from tandem_server.layers.activation import activation
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, AttentionParams, LayerCache
from tandem_server.layers.embedding import Embedding, InputEmbeddings, LMHead
from tandem_server.layers.head_partition import partition_heads
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.mlp import GatedMLP
from tandem_server.layers.moe import MoeArgs, SparseMoeBlock
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryAngles, RotaryEmbedding
from tandem_server.models.causal_lm import CausalLM
from tandem_server.models.config import ModelSpec
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter

LAYER_TYPES = ("full_attention", "sliding_attention")
QueryKeyValue = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class LayerKind:
    """What differs between layers of one model: the rotary table, the sliding window, whether the feed-forward
    is the model's mixture-of-experts block rather than a dense MLP, and whether the layer keeps a fixed-size recurrent
    state per sequence (a `RecurrentLayer`) rather than paged keys and values."""

    rope: RopeConfig
    sliding_window: int | None = None
    sparse_mlp: bool = False
    recurrent: bool = False


@dataclass(frozen=True)
class DecoderArgs:
    """Every size and option of a decoder, read from config.json by the family's file."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    layers: tuple[LayerKind, ...]
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # OLMoE, OLMo 3: the q/k norms span the whole query and key projections rather than each head.
    qk_norm_over_projection: bool = False
    # Gemma: norms scale by (1 + weight), embeddings are multiplied by sqrt(hidden_size).
    norm_unit_offset: bool = False
    embedding_scale: float | None = None
    # None means head_dim ** -0.5.
    query_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    # gpt-oss: a learned logit per query head (`self_attn.sinks`) joins every attention softmax's denominator.
    attention_sinks: bool = False
    layout: CheckpointLayout = field(default_factory=CheckpointLayout)
    # The MoE block of the layers whose kind says `sparse_mlp`.
    moe: MoeArgs | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def common_sizes(hf: dict[str, Any]) -> dict[str, Any]:
    """The DecoderArgs fields every family spells the same way in config.json (all but `layers` and options)."""
    num_heads = int(hf["num_attention_heads"])
    hidden_act = hf.get("hidden_act") or hf.get("hidden_activation") or "silu"
    activation(hidden_act)
    return {
        "vocab_size": int(hf["vocab_size"]),
        "hidden_size": int(hf["hidden_size"]),
        "intermediate_size": int(hf["intermediate_size"]),
        "num_heads": num_heads,
        "num_kv_heads": int(hf.get("num_key_value_heads") or num_heads),
        "head_dim": int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": served_positions(hf, int(hf.get("max_position_embeddings", 2048))),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "hidden_act": hidden_act,
    }


def windows_from_layer_types(hf: dict[str, Any]) -> tuple[int | None, ...] | None:
    """Per-layer sliding windows from `layer_types`, or None when config.json has no `layer_types`."""
    layer_types = hf.get("layer_types")
    if layer_types is None:
        return None
    if len(layer_types) != int(hf["num_hidden_layers"]):
        raise ConfigError(
            f"layer_types lists {len(layer_types)} layers, num_hidden_layers is {hf['num_hidden_layers']}"
        )
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ConfigError(f"unsupported layer types {unknown}; supported: {', '.join(LAYER_TYPES)}")
    window = hf.get("sliding_window")
    if "sliding_attention" in layer_types and not window:
        raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
    return tuple(int(window) if kind == "sliding_attention" and window else None for kind in layer_types)


def uniform_layers(hf: dict[str, Any], windows: Sequence[int | None] | None) -> tuple[LayerKind, ...]:
    """One rotary configuration for every layer, with the given per-layer windows (None: no window anywhere)."""
    rope = RopeConfig.from_hf(hf)
    windows = windows if windows is not None else [None] * int(hf["num_hidden_layers"])
    return tuple(LayerKind(rope, window) for window in windows)


class DecoderAttention(nn.Module):
    """Grouped-query self-attention over the query and KV heads `partition_heads` gives this rank."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        heads = partition_heads(args.num_heads, args.num_kv_heads, args.head_dim, parallel)
        self.num_heads, self.num_kv_heads = heads.num_heads, heads.num_kv_heads
        self.head_dim = args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.q_proj = ColumnParallelLinear(args.hidden_size, q_size, args.qkv_bias, parallel, heads.query_features)
        self.k_proj = ColumnParallelLinear(args.hidden_size, kv_size, args.qkv_bias, parallel, heads.kv_features)
        self.v_proj = ColumnParallelLinear(args.hidden_size, kv_size, args.qkv_bias, parallel, heads.kv_features)
        self.o_proj = RowParallelLinear(q_size, args.hidden_size, args.o_bias, parallel, heads.query_features)
        self.qkv_proj = StackedColumns((self.q_proj, self.k_proj, self.v_proj))
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, args.norm_unit_offset)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, args.norm_unit_offset)
        if args.qk_norm_over_projection:
            if parallel.world_size > 1:
                raise ConfigError(
                    "this model normalises queries and keys over all heads at once, which tensor parallelism splits "
                    f"across ranks; serve it on one rank (this group has {parallel.world_size})"
                )
            self.q_norm = RMSNorm(q_size, args.rms_norm_eps, args.norm_unit_offset)
            self.k_norm = RMSNorm(kv_size, args.rms_norm_eps, args.norm_unit_offset)
        self.qk_norm = args.qk_norm
        self.qk_norm_over_projection = args.qk_norm_over_projection
        scale = args.query_scale if args.query_scale is not None else args.head_dim**-0.5
        sinks = None
        if args.attention_sinks:
            self.sinks = sliced_parameter((heads.num_heads,), CheckpointSlice.of(0, heads.query_heads))
            sinks = self.sinks
        self.params = AttentionParams(scale, kind.sliding_window, args.attn_logit_softcap, sinks)

    def project(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        """The attention inputs of normalised `hidden`: rotated queries and keys `[tokens, heads, head_dim]`, values."""
        tokens = hidden.shape[0]
        query, key, value = self.qkv_proj(hidden)
        if self.qk_norm_over_projection:
            query, key = self.q_norm(query), self.k_norm(key)
        query = query.view(tokens, self.num_heads, self.head_dim)
        key = key.view(tokens, self.num_kv_heads, self.head_dim)
        value = value.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        return rotation.rotate(query), rotation.rotate(key), value

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """The output projection of the attended heads `[tokens, heads, head_dim]`."""
        return self.o_proj(attended.reshape(attended.shape[0], self.num_heads * self.head_dim))


class StagedLayer(nn.Module):
    """A decoder layer in two stages around the attention backend: `attention_inputs` (everything before attention
    reads the cache) and `after_attention` (everything after). The stages see only tensors and this layer's weights,
    so `torch.compile` can compile each once for every layer of a class (`execution/compiled_layers.py`)."""

    self_attn: DecoderAttention

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        """The rotated queries and keys and the values of the layer's input `hidden`."""
        raise NotImplementedError

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input `hidden` and the attended heads."""
        raise NotImplementedError

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: RotaryAngles,
        cache: LayerCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        query, key, value = self.attention_inputs(hidden, rotation)
        attended = backend.forward(query, key, value, cache, metadata, self.self_attn.params)
        return self.after_attention(hidden, attended)


class DecoderLayer(StagedLayer):
    """Pre-norm attention and MLP blocks, each with a residual connection (Llama layout)."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, args.norm_unit_offset)
        self.self_attn = DecoderAttention(args, kind, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, args.norm_unit_offset)
        self.mlp = feed_forward(args, kind, parallel)

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        return self.self_attn.project(self.input_layernorm(hidden), rotation)

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn.output(attended)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def dense_mlp(args: DecoderArgs, parallel: ParallelContext) -> GatedMLP:
    """The dense gated MLP of `args`' sizes."""
    return GatedMLP(args.hidden_size, args.intermediate_size, args.mlp_bias, args.hidden_act, parallel)


def feed_forward(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> nn.Module:
    """The layer's feed-forward: the model's MoE block where `kind` says so, else the dense MLP."""
    if not kind.sparse_mlp:
        return dense_mlp(args, parallel)
    if args.moe is None:
        raise ValueError("invariant: a family that marks sparse layers gives their MoE block")
    return SparseMoeBlock(args.hidden_size, args.moe, args.hidden_act, parallel)


class RecurrentLayer(nn.Module):
    """A layer that keeps a fixed-size state per sequence (a hybrid model's short convolution or linear attention)
    in the shard's state pool instead of keys and values in the paged cache."""

    # One sequence's states in this layer, on this rank: each its own pool, numbered from the layer's first.
    state_shapes: tuple[tuple[int, ...], ...]
    # Per state, the dtype it must be kept in whatever the model's (None, or no entry: the model's dtype).
    state_dtypes: tuple[torch.dtype | None, ...] = ()

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, state_layer: int
    ) -> torch.Tensor:
        """The layer's output; the sequences' states are `states.layers[state_layer + i]` at `states.slots` for
        each of its states i (None: every sequence starts afresh and keeps nothing, as in warm-up)."""
        raise NotImplementedError


class FeedForwardLayer(nn.Module):
    """A layer that keeps nothing between steps (a hybrid model's MLP-only block): neither paged keys and values nor
    recurrent state."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# A layer called as `layer(hidden, rotation, cache, metadata, backend)`: a `StagedLayer`, or a layer whose attention
# is not the backend's (multi-head latent attention).
LayerFactory = Callable[[DecoderArgs, LayerKind, ParallelContext], nn.Module]


class DecoderModel(nn.Module):
    """Embedding, decoder stack and final norm; parameter names follow the checkpoint's `model.*`."""

    def __init__(
        self, args: DecoderArgs, parallel: ParallelContext, backend: AttentionBackend, layer_factory: LayerFactory
    ) -> None:
        super().__init__()
        self.backend = backend
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size, parallel)
        # The scale is rounded to the model dtype first, as the reference multiplies by a tensor of that dtype.
        scale = args.embedding_scale
        self.embedding_scale = None if scale is None else torch.tensor(scale, dtype=torch.get_default_dtype()).item()
        # One cos/sin table per distinct rotary configuration; each step takes its angles once per table, and every
        # layer using the table rotates by them.
        ropes = list(dict.fromkeys(kind.rope for kind in args.layers))
        self.rotary_tables = nn.ModuleList(
            RotaryEmbedding(args.head_dim, args.max_position_embeddings, rope) for rope in ropes
        )
        self.layer_tables = tuple(ropes.index(kind.rope) for kind in args.layers)
        self.layers = nn.ModuleList(layer_factory(args, kind, parallel) for kind in args.layers)
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, args.norm_unit_offset)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: StepStates | None = None,
        embeddings: InputEmbeddings | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.embedding_scale is not None:
            hidden = hidden * self.embedding_scale
        # Given embeddings are the model's inputs as they are: the token embeddings' scale never applies to them.
        if embeddings is not None:
            hidden = embeddings.written_into(hidden)
        angles = [cast(RotaryEmbedding, table).angles(positions, hidden.dtype) for table in self.rotary_tables]
        # Paged caches and state pools are numbered among the layers of their own kind, in layer order.
        caches = iter(kv_cache)
        state_layer = 0
        for layer, table in zip(self.layers, self.layer_tables, strict=True):
            if isinstance(layer, RecurrentLayer):
                hidden = layer(hidden, metadata.paged.query_lens, states, state_layer)
                state_layer += len(layer.state_shapes)
            elif isinstance(layer, FeedForwardLayer):
                hidden = layer(hidden)
            else:
                hidden = layer(hidden, angles[table], next(caches), metadata, self.backend)
        return self.norm(hidden)


class DecoderForCausalLM(CausalLM):
    """Causal LM over a flat batch of tokens from many requests; logits only for the rows asked."""

    def __init__(
        self,
        args: DecoderArgs,
        parallel: ParallelContext,
        backend: AttentionBackend,
        layer_factory: LayerFactory = DecoderLayer,
    ) -> None:
        super().__init__()
        self.args = args
        self.backend = backend
        self.model = DecoderModel(args, parallel, backend, layer_factory)
        tied = self.model.embed_tokens if args.tie_word_embeddings else None
        self.lm_head = LMHead(args.vocab_size, args.hidden_size, tied, parallel)
        recurrent = [layer for layer in self.model.layers if isinstance(layer, RecurrentLayer)]
        cacheless = sum(isinstance(layer, FeedForwardLayer) for layer in self.model.layers)
        self.spec = ModelSpec(
            vocab_size=args.vocab_size,
            num_layers=args.num_layers - len(recurrent) - cacheless,
            num_kv_heads=partition_heads(args.num_heads, args.num_kv_heads, args.head_dim, parallel).num_kv_heads,
            head_dim=args.head_dim,
            max_position_embeddings=args.max_position_embeddings,
            state_shapes=tuple(shape for layer in recurrent for shape in layer.state_shapes),
            state_dtypes=tuple(
                dtype
                for layer in recurrent
                for dtype, _ in itertools.zip_longest(layer.state_dtypes, layer.state_shapes)
            ),
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: StepStates | None = None,
        embeddings: InputEmbeddings | None = None,
    ) -> torch.Tensor:
        """Final hidden states `[tokens, hidden]`; K/V of every token are written into `kv_cache`, the recurrent
        layers' states into `states`; the rows `embeddings` names run on its values."""
        return self.model(input_ids, positions, kv_cache, metadata, states, embeddings)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[rows, vocab]` for the selected hidden rows."""
        logits = self.lm_head(hidden)
        cap = self.args.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def checkpoint_layout(self) -> CheckpointLayout:
        """How checkpoint tensors map onto parameters; a tied head's duplicate tensor is skipped."""
        layout = self.args.layout
        if not self.args.tie_word_embeddings:
            return layout
        return replace(layout, skipped=layout.skipped | {"lm_head.weight"})
