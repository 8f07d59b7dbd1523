"""Gemma 4 text: Gemma 3's four norms per layer (plain `weight` scales), unscaled attention over normalised queries,
keys and values, wider heads on global layers (proportional rotary), per-layer input embeddings, KV sharing between
the last layers and earlier ones, a learned scalar per layer, optional final-logit soft-capping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.activation import activation
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, AttentionParams, LayerCache
from tandem_server.layers.embedding import Embedding, InputEmbeddings, LMHead
from tandem_server.layers.head_partition import partition_heads
from tandem_server.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.mlp import GatedMLP
from tandem_server.layers.norm import RMSNorm, rms_normalise
from tandem_server.layers.per_layer_inputs import PerLayerInputs
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rotary import RotaryAngles, RotaryEmbedding
from tandem_server.models.causal_lm import CausalLM
from tandem_server.models.config import ModelSpec
from tandem_server.models.decoder import QueryKeyValue
from tandem_server.models.gemma4_config import Gemma4Args, Gemma4LayerSpec, gemma4_args
from tandem_server.weights.layout import CheckpointLayout, Renamed
from tandem_server.weights.slicing import sliced_parameter

KeyValue = tuple[torch.Tensor, torch.Tensor]
# The per-layer input tensors sit directly under `model.` in the checkpoint, under `model.per_layer_inputs.` here.
PER_LAYER_INPUT_NAMES = Renamed(
    r"^model\.(embed_tokens_per_layer|per_layer_model_projection|per_layer_projection_norm)\.",
    r"model.per_layer_inputs.\1.",
)
KV_PROJECTIONS = ("k_proj", "v_proj", "k_norm", "v_norm")


class Gemma4Attention(nn.Module):
    """Grouped-query attention with this layer's own head size and KV heads, split across ranks as every family's.

    A layer that shares another's keys and values holds only its query and output projections."""

    def __init__(self, args: Gemma4Args, layer: Gemma4LayerSpec, parallel: ParallelContext) -> None:
        super().__init__()
        heads = partition_heads(args.num_heads, layer.num_kv_heads, layer.head_dim, parallel)
        self.num_heads, self.num_kv_heads, self.head_dim = heads.num_heads, heads.num_kv_heads, layer.head_dim
        self.eps = args.rms_norm_eps
        q_size, kv_size = args.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        bias = args.attention_bias
        self.q_proj = ColumnParallelLinear(args.hidden_size, q_size, bias, parallel, heads.query_features)
        self.q_norm = RMSNorm(layer.head_dim, args.rms_norm_eps, float32_scale=True)
        self.o_proj = RowParallelLinear(q_size, args.hidden_size, bias, parallel, heads.query_features)
        self.owns_kv = layer.kv_source is None
        if self.owns_kv:
            self.k_proj = ColumnParallelLinear(args.hidden_size, kv_size, bias, parallel, heads.kv_features)
            self.k_norm = RMSNorm(layer.head_dim, args.rms_norm_eps, float32_scale=True)
            projections = [self.q_proj, self.k_proj]
            if not layer.values_from_keys:
                self.v_proj = ColumnParallelLinear(args.hidden_size, kv_size, bias, parallel, heads.kv_features)
                projections.append(self.v_proj)
            self.qkv_proj = StackedColumns(projections)
        self.params = AttentionParams(1.0, layer.kind.sliding_window)

    def project(self, hidden: torch.Tensor, rotation: RotaryAngles, shared: KeyValue | None) -> QueryKeyValue:
        """Rotated queries, and keys and values: this layer's own, or `shared` (those of the layer it reuses)."""
        tokens = hidden.shape[0]
        if self.owns_kv:
            query, key, *values = self.qkv_proj(hidden)
            # Without a value projection the values are the raw key projection.
            value = (values[0] if values else key).view(tokens, self.num_kv_heads, self.head_dim)
            key = rotation.rotate(self.k_norm(key.view(tokens, self.num_kv_heads, self.head_dim)))
            value = rms_normalise(value, self.eps)
        elif shared is not None:
            query = self.q_proj(hidden)
            key, value = shared
        else:
            raise ValueError("invariant: a layer without key and value projections is given its source layer's")
        query = rotation.rotate(self.q_norm(query.view(tokens, self.num_heads, self.head_dim)))
        return query, key, value

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attended.reshape(attended.shape[0], self.num_heads * self.head_dim))


class Gemma4DecoderLayer(nn.Module):
    """Attention and MLP blocks normalised on the way in and out, then the per-layer input's gated residual; the
    layer's output is scaled by its learned `layer_scalar`."""

    def __init__(self, args: Gemma4Args, layer: Gemma4LayerSpec, parallel: ParallelContext) -> None:
        super().__init__()
        size, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps, float32_scale=True)
        self.self_attn = Gemma4Attention(args, layer, parallel)
        self.post_attention_layernorm = RMSNorm(size, eps, float32_scale=True)
        self.pre_feedforward_layernorm = RMSNorm(size, eps, float32_scale=True)
        self.mlp = GatedMLP(size, layer.intermediate_size, False, args.hidden_act, parallel)
        self.post_feedforward_layernorm = RMSNorm(size, eps, float32_scale=True)
        self.per_layer_input_size = args.per_layer_input_size
        if args.per_layer_input_size:
            self.act = activation(args.hidden_act)
            self.per_layer_input_gate = ReplicatedLinear(size, args.per_layer_input_size)
            self.per_layer_projection = ReplicatedLinear(args.per_layer_input_size, size)
            self.post_per_layer_input_norm = RMSNorm(size, eps, float32_scale=True)
        self.layer_scalar = sliced_parameter((1,), None)

    def forward(
        self,
        hidden: torch.Tensor,
        per_layer_input: torch.Tensor | None,
        rotation: RotaryAngles,
        cache: LayerCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        shared: KeyValue | None,
    ) -> tuple[torch.Tensor, KeyValue]:
        """The layer's output and the keys and values it attended over (for the layers that reuse them).

        A layer that reuses another's keys and values writes them into that layer's cache again at the same slots:
        the same values, so the cache is unchanged and every backend attends as for any layer."""
        query, key, value = self.self_attn.project(self.input_layernorm(hidden), rotation, shared)
        attended = backend.forward(query, key, value, cache, metadata, self.self_attn.params)
        hidden = hidden + self.post_attention_layernorm(self.self_attn.output(attended))
        hidden = hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))
        if per_layer_input is not None:
            gated = self.act(self.per_layer_input_gate(hidden)) * per_layer_input
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return hidden * self.layer_scalar, (key, value)


class Gemma4Model(nn.Module):
    """Scaled embeddings, per-layer inputs, the decoder stack and the final norm (checkpoint names `model.*`)."""

    def __init__(self, args: Gemma4Args, parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__()
        self.backend = backend
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size, parallel)
        # The reference multiplies by the scale rounded to the model dtype.
        self.embedding_scale = torch.tensor(args.hidden_size**0.5, dtype=torch.get_default_dtype()).item()
        self.per_layer_inputs = (
            PerLayerInputs(
                args.per_layer_vocab_size,
                len(args.layers),
                args.per_layer_input_size,
                args.hidden_size,
                args.rms_norm_eps,
                parallel,
            )
            if args.per_layer_input_size
            else None
        )
        # One cos/sin table per (rotary parameters, head size): sliding and global layers differ in both.
        tables = list(dict.fromkeys((layer.kind.rope, layer.head_dim) for layer in args.layers))
        self.rotary_tables = nn.ModuleList(
            RotaryEmbedding(head_dim, args.max_position_embeddings, rope) for rope, head_dim in tables
        )
        self.layer_tables = tuple(tables.index((layer.kind.rope, layer.head_dim)) for layer in args.layers)
        self.layers = nn.ModuleList(Gemma4DecoderLayer(args, layer, parallel) for layer in args.layers)
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, float32_scale=True)
        self.kv_sources = tuple(layer.kv_source for layer in args.layers)
        self.kept_kv = args.kv_sources
        self.cache_index = cache_indices(args)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
        embeddings: InputEmbeddings | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.embedding_scale
        if embeddings is not None:
            hidden = embeddings.written_into(hidden)
        per_layer = self.per_layer_inputs(input_ids, hidden) if self.per_layer_inputs is not None else None
        angles = [cast(RotaryEmbedding, table).angles(positions, hidden.dtype) for table in self.rotary_tables]
        # Only the step's keys and values of layers that later layers reuse are kept.
        kept: dict[int, KeyValue] = {}
        for index, layer in enumerate(self.layers):
            source = self.kv_sources[index]
            hidden, key_value = layer(
                hidden,
                per_layer[:, index] if per_layer is not None else None,
                angles[self.layer_tables[index]],
                kv_cache[self.cache_index[index]],
                metadata,
                self.backend,
                kept[source] if source is not None else None,
            )
            if index in self.kept_kv:
                kept[index] = key_value
        return self.norm(hidden)


def cache_indices(args: Gemma4Args) -> tuple[int, ...]:
    """Per layer, which cache it reads: layers with their own keys and values have one each, in order; a layer that
    reuses another's reads that layer's."""
    owned = [i for i, layer in enumerate(args.layers) if layer.kv_source is None]
    return tuple(owned.index(i if layer.kv_source is None else layer.kv_source) for i, layer in enumerate(args.layers))


class Gemma4ForCausalLM(CausalLM):
    """Gemma 4's text decoder (tied embeddings by default); also the text part of its conditional-generation
    checkpoints."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__()
        args = gemma4_args(hf_config)
        self.args = args
        self.backend = backend
        self.model = Gemma4Model(args, parallel, backend)
        tied = self.model.embed_tokens if args.tie_word_embeddings else None
        self.lm_head = LMHead(args.vocab_size, args.hidden_size, tied, parallel)
        attention = [cast(Gemma4DecoderLayer, layer).self_attn for layer in self.model.layers]
        cached = [(a.num_kv_heads, a.head_dim) for a in attention if a.owns_kv]
        self.spec = ModelSpec(
            vocab_size=args.vocab_size,
            num_layers=len(args.layers),
            num_kv_heads=cached[0][0],
            head_dim=cached[0][1],
            max_position_embeddings=args.max_position_embeddings,
            cache_layers=tuple(cached),
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
        """Final hidden states `[tokens, hidden]`; K/V of the layers that keep them are written into `kv_cache`
        (Gemma 4 keeps no recurrent state, so `states` is always None); the rows `embeddings` names run on its
        values."""
        return cast(torch.Tensor, self.model(input_ids, positions, kv_cache, metadata, embeddings))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[rows, vocab]`, soft-capped when the config says so."""
        logits = self.lm_head(hidden)
        cap = self.args.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def checkpoint_layout(self) -> CheckpointLayout:
        """Per-layer input tensors renamed under `model.per_layer_inputs`; a tied head and the key and value tensors
        some checkpoints still hold for KV-sharing layers are skipped."""
        skipped = {
            f"model.layers.{index}.self_attn.{name}.weight"
            for index, layer in enumerate(self.args.layers)
            if layer.kv_source is not None
            for name in KV_PROJECTIONS
        }
        if self.args.tie_word_embeddings:
            skipped.add("lm_head.weight")
        return CheckpointLayout(skipped=frozenset(skipped), renamed=(PER_LAYER_INPUT_NAMES,))
