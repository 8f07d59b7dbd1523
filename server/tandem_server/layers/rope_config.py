"""Rotary parameters read from config.json, resolved once into the values the cos/sin tables need."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError

# Keys every rope type may carry; `original_max_position_embeddings` is read only by the types that name it below,
# as transformers ignores it elsewhere.
COMMON_KEYS = (
    "rope_type",
    "type",
    "rope_theta",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "mrope_section",
)
# The options each supported type reads, beyond COMMON_KEYS (transformers' own lists).
TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "attention_factor"),
    "dynamic": ("factor",),
    # Gemma 4's global layers: the first `partial_rotary_factor` of each head's pairs rotate with frequencies spaced
    # over the whole head, the other pairs keep frequency zero; pairs still span the two halves of the head.
    "proportional": ("factor",),
}
ROPE_TYPES = tuple(TYPE_KEYS)
# The types whose tables depend on the pretraining context (`original_max_position_embeddings`).
ORIGINAL_CONTEXT_TYPES = ("llama3", "yarn", "longrope")
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class RopeConfig:
    """Rotary parameters with every default and derived value resolved (as transformers resolves them)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # The pretraining context: llama3, yarn and longrope read it from their options; for dynamic it is config.json's
    # max_position_embeddings, past which the base grows.
    original_max_position_embeddings: int = 8192
    # Share of each head's dimensions that is rotated; the rest passes through unchanged.
    partial_rotary_factor: float = 1.0
    # yarn and longrope multiply cos and sin by it.
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # longrope: per-pair divisors of the frequencies below and from original_max_position_embeddings on.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    # GLM's layout: each rotated pair is two adjacent dimensions instead of one from each half.
    interleaved: bool = False
    # Multimodal rotary (Qwen2-VL's M-RoPE): consecutive runs of this many pairs, in order, rotate by a token's
    # temporal, height and width position (then temporal again, and so on); empty: one position per token. A token
    # whose three positions are equal rotates exactly as under plain rotary.
    mrope_section: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> RopeConfig:
        """Accepts both the current `rope_parameters` and the older `rope_theta`/`rope_scaling` spellings; an
        unknown rope type or an option its type does not read is refused, naming it."""
        params = dict(config.get("rope_scaling") or {})
        params.update(config.get("rope_parameters") or {})
        rope_type = params.get("rope_type", params.get("type", "default"))
        # transformers reads Qwen2-VL's "mrope" type as the default frequencies split into `mrope_section`.
        rope_type = "default" if rope_type == "mrope" else rope_type
        if rope_type not in TYPE_KEYS:
            raise ConfigError(f"unsupported rope scaling {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        known = COMMON_KEYS + TYPE_KEYS[rope_type]
        unknown = sorted(key for key in params if key not in known)
        if unknown:
            raise ConfigError(
                f"unsupported {rope_type} rope options {unknown}; {rope_type} reads: {', '.join(known[2:])}"
            )
        max_positions = int(config.get("max_position_embeddings") or DEFAULT_MAX_POSITION_EMBEDDINGS)
        original = _original_context(config, params, rope_type, max_positions)
        factor = params.get("factor")
        if factor is None and rope_type in ("yarn", "longrope"):
            factor = max_positions / original
        factor = float(factor if factor is not None else 1.0)
        defaults = cls()
        return cls(
            theta=float(params.get("rope_theta", config.get("rope_theta", defaults.theta))),
            rope_type=rope_type,
            factor=factor,
            low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
            high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
            original_max_position_embeddings=original,
            partial_rotary_factor=float(
                params.get("partial_rotary_factor", config.get("partial_rotary_factor", defaults.partial_rotary_factor))
            ),
            attention_factor=_attention_factor(params, rope_type, factor, original),
            # transformers reads `x or default`: a zero or null beta takes the default too.
            beta_fast=float(params.get("beta_fast") or defaults.beta_fast),
            beta_slow=float(params.get("beta_slow") or defaults.beta_slow),
            truncate=bool(params.get("truncate", defaults.truncate)),
            short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
            long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
            mrope_section=tuple(int(pairs) for pairs in params.get("mrope_section") or ()),
        )

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dimensions of each head the rotation table covers (proportional: the whole head)."""
        if self.rope_type == "proportional":
            return head_dim
        return int(head_dim * self.partial_rotary_factor)

    def check_head_dim(self, head_dim: int) -> None:
        """Refuses longrope factor lists that do not give one divisor per rotated pair, and multimodal rotary sections
        that do not add up to the rotated pairs."""
        pairs = self.rotary_dim(head_dim) // 2
        if self.mrope_section and sum(self.mrope_section) != pairs:
            raise ConfigError(
                f"mrope_section {list(self.mrope_section)} adds up to {sum(self.mrope_section)} pairs; "
                f"the heads rotate {pairs}"
            )
        for name, factors in (("short_factor", self.short_factor), ("long_factor", self.long_factor)):
            if self.rope_type == "longrope" and len(factors) != pairs:
                raise ConfigError(f"longrope {name} has {len(factors)} values; the heads rotate {pairs} pairs")


# A layer without rotary position embedding (NoPE) rotates none of its dimensions.
NO_ROTATION = RopeConfig(partial_rotary_factor=0.0)


def _original_context(config: dict[str, Any], params: dict[str, Any], rope_type: str, max_positions: int) -> int:
    """transformers' rule: a top-level `original_max_position_embeddings` (Phi-3) wins over the rope options' own,
    and without either the context is max_position_embeddings; dynamic grows past max_position_embeddings."""
    if rope_type == "dynamic":
        return max_positions
    if rope_type not in ORIGINAL_CONTEXT_TYPES:
        return RopeConfig.original_max_position_embeddings
    value = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    return int(value or max_positions)


def _attention_factor(params: dict[str, Any], rope_type: str, factor: float, original: int) -> float:
    """The cos/sin multiplier: given, or derived from the scaling as transformers derives it."""
    given = params.get("attention_factor")
    if given is not None:
        return float(given)
    if rope_type == "yarn":
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        return _yarn_mscale(factor)
    if rope_type == "longrope" and factor > 1.0:
        return math.sqrt(1 + math.log(factor) / math.log(original))
    return 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
