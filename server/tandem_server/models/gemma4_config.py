"""Gemma 4's config.json read into per-layer facts: window, rotary table, head size, KV heads, KV sharing, MLP width."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.models.decoder import LAYER_TYPES, LayerKind, common_sizes

DEFAULT_SLIDING_WINDOW = 512
DEFAULT_GLOBAL_HEAD_DIM = 512
# transformers' default: a config without `hidden_size_per_layer_input` has per-layer inputs; 0 or null turns them off.
DEFAULT_PER_LAYER_INPUT_SIZE = 256
# Without `layer_types`, every sixth layer attends globally and the others slide.
DEFAULT_SLIDING_WINDOW_PATTERN = 6
DEFAULT_ROPE_PARAMETERS: dict[str, dict[str, Any]] = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
# What a `per_layer_config` entry may override; any other key is refused rather than ignored.
PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")


@dataclass(frozen=True)
class Gemma4LayerSpec:
    """One decoder layer's shape."""

    kind: LayerKind
    head_dim: int
    num_kv_heads: int
    # The earlier layer whose keys and values this layer attends over (KV sharing); None: it projects its own.
    kv_source: int | None
    # Global layers with `attention_k_eq_v`: the values are the key projection, before the key norm and rotation.
    values_from_keys: bool
    intermediate_size: int


@dataclass(frozen=True)
class Gemma4Args:
    """Every size and option of a Gemma 4 text decoder."""

    vocab_size: int
    hidden_size: int
    num_heads: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    attention_bias: bool
    layers: tuple[Gemma4LayerSpec, ...]
    # Per-layer input embeddings: the size of each layer's input (0: none) and the vocabulary of their table.
    per_layer_input_size: int
    per_layer_vocab_size: int
    final_logit_softcap: float | None

    @property
    def kv_sources(self) -> frozenset[int]:
        """The layers whose keys and values later layers reuse."""
        return frozenset(layer.kv_source for layer in self.layers if layer.kv_source is not None)


def gemma4_args(hf: dict[str, Any]) -> Gemma4Args:
    """Gemma 4's options from a saved config (`per_layer_config`) or a published one (`global_head_dim`)."""
    _refuse_unsupported(hf)
    sizes = common_sizes({**hf, "hidden_activation": hf.get("hidden_activation") or "gelu_pytorch_tanh"})
    layer_types = _layer_types(hf)
    overrides = _per_layer_overrides(hf, layer_types, sizes["head_dim"], sizes["num_kv_heads"])
    sources = _kv_sources(layer_types, int(hf.get("num_kv_shared_layers") or 0))
    window = int(hf.get("sliding_window") or DEFAULT_SLIDING_WINDOW)
    ropes = _ropes(hf)
    double_wide = bool(hf.get("use_double_wide_mlp"))
    layers = tuple(
        Gemma4LayerSpec(
            kind=LayerKind(ropes[layer_type], window if layer_type == "sliding_attention" else None),
            head_dim=head_dim,
            num_kv_heads=num_kv_heads,
            kv_source=source,
            values_from_keys=bool(hf.get("attention_k_eq_v")) and layer_type == "full_attention",
            intermediate_size=sizes["intermediate_size"] * (2 if double_wide and source is not None else 1),
        )
        for layer_type, (head_dim, num_kv_heads), source in zip(layer_types, overrides, sources, strict=True)
    )
    softcap = hf.get("final_logit_softcapping")
    return Gemma4Args(
        vocab_size=sizes["vocab_size"],
        hidden_size=sizes["hidden_size"],
        num_heads=sizes["num_heads"],
        rms_norm_eps=sizes["rms_norm_eps"],
        max_position_embeddings=sizes["max_position_embeddings"],
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        hidden_act=sizes["hidden_act"],
        attention_bias=bool(hf.get("attention_bias", False)),
        layers=layers,
        per_layer_input_size=int(hf.get("hidden_size_per_layer_input", DEFAULT_PER_LAYER_INPUT_SIZE) or 0),
        per_layer_vocab_size=int(hf.get("vocab_size_per_layer_input") or sizes["vocab_size"]),
        final_logit_softcap=None if softcap is None else float(softcap),
    )


def _refuse_unsupported(hf: dict[str, Any]) -> None:
    if hf.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention 'all' is not supported; only causal Gemma 4 models are")
    if hf.get("enable_moe_block"):
        raise ConfigError("Gemma 4's mixture-of-experts block (enable_moe_block) is not supported; dense Gemma 4 is")


def _layer_types(hf: dict[str, Any]) -> list[str]:
    """`layer_types`, or five sliding layers to one global; the last layer is always global, as transformers
    forces it."""
    num_layers = int(hf["num_hidden_layers"])
    layer_types = list(hf.get("layer_types") or [])
    if not layer_types:
        pattern = DEFAULT_SLIDING_WINDOW_PATTERN
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types lists {len(layer_types)} layers, num_hidden_layers is {num_layers}")
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ConfigError(f"unsupported layer types {unknown}; supported: {', '.join(LAYER_TYPES)}")
    layer_types[-1] = "full_attention"
    return layer_types


def _per_layer_overrides(
    hf: dict[str, Any], layer_types: list[str], head_dim: int, num_kv_heads: int
) -> list[tuple[int, int]]:
    """(head_dim, kv heads) per layer: `per_layer_config` entries by layer index where config.json has them, else
    `global_head_dim` (and, with `attention_k_eq_v`, `num_global_key_value_heads`) on the global layers."""
    entries = hf.get("per_layer_config")
    if entries is None:
        global_override: dict[str, Any] = {"head_dim": int(hf.get("global_head_dim") or DEFAULT_GLOBAL_HEAD_DIM)}
        if hf.get("attention_k_eq_v") and hf.get("num_global_key_value_heads") is not None:
            global_override["num_key_value_heads"] = int(hf["num_global_key_value_heads"])
        entries = {str(i): global_override for i, kind in enumerate(layer_types) if kind == "full_attention"}
    shapes = [(head_dim, num_kv_heads)] * len(layer_types)
    for key, entry in entries.items():
        index = int(key)
        if not 0 <= index < len(layer_types):
            raise ConfigError(f"per_layer_config names layer {index}; the model has {len(layer_types)} layers")
        unknown = sorted(set(entry) - set(PER_LAYER_KEYS))
        if unknown:
            raise ConfigError(f"per_layer_config overrides {unknown} on layer {index}; supported: {PER_LAYER_KEYS}")
        shapes[index] = (int(entry.get("head_dim", head_dim)), int(entry.get("num_key_value_heads", num_kv_heads)))
    return shapes


def _kv_sources(layer_types: list[str], num_shared: int) -> list[int | None]:
    """The last `num_shared` layers reuse the keys and values of the last earlier layer of their type."""
    num_layers = len(layer_types)
    if not 0 <= num_shared < num_layers:
        raise ConfigError(f"num_kv_shared_layers is {num_shared}; it must be below num_hidden_layers ({num_layers})")
    first_shared = num_layers - num_shared
    producers = {kind: index for index, kind in enumerate(layer_types[:first_shared])}
    sources: list[int | None] = [None] * first_shared
    for index in range(first_shared, num_layers):
        kind = layer_types[index]
        if kind not in producers:
            raise ConfigError(
                f"layer {index} shares the keys and values of a {kind} layer, but no earlier layer is one"
            )
        sources.append(producers[kind])
    return sources


def _ropes(hf: dict[str, Any]) -> dict[str, RopeConfig]:
    """The rotary parameters of each layer type, nested by type in `rope_parameters`."""
    nested = hf.get("rope_parameters") or DEFAULT_ROPE_PARAMETERS
    context = {"max_position_embeddings": hf.get("max_position_embeddings")}
    return {
        kind: RopeConfig.from_hf({**context, "rope_parameters": nested.get(kind) or DEFAULT_ROPE_PARAMETERS[kind]})
        for kind in LAYER_TYPES
    }
