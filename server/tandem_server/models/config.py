"""Reads a checkpoint directory's config.json and generation_config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem_server.errors import ConfigError
from tandem_server.models.text_part import TEXT_PARTS, TextPart
from tandem_server.quant.fp8.scheme import Fp8Scheme, checkpoint_fp8_scheme
from tandem_server.quant.int4.scheme import INT4_METHODS, Int4Scheme, checkpoint_int4_scheme
from tandem_server.quant.mxfp4.format import is_mxfp4

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CheckpointConfig:
    """The raw model configuration plus the facts the shard needs before building the model."""

    path: Path
    hf: dict[str, Any]
    architecture: str
    eos_token_ids: tuple[int, ...]
    # The FP8 layout config.json's `quantization_config` declares; None for a float checkpoint.
    fp8: Fp8Scheme | None = None
    # The GPTQ/AWQ packing config.json's `quantization_config` declares; None unless it is an int4 checkpoint.
    int4: Int4Scheme | None = None
    # Routed experts per MoE layer; 0 for a dense model.
    num_experts: int = 0
    # The expert weights are MXFP4 blocks (`quant_method: mxfp4`, gpt-oss), which the family's experts hold packed.
    mxfp4: bool = False
    # A conditional-generation checkpoint served as its text decoder: `hf` is then the text configuration,
    # `skipped_parts` names the sub-models (vision, audio) that are not loaded, and `whole_hf` is config.json itself
    # (the settings of the sub-models served beside the text decoder).
    text_part: TextPart | None = None
    skipped_parts: tuple[str, ...] = ()
    whole_hf: dict[str, Any] | None = None

    @property
    def family(self) -> str:
        """The registered family that serves the checkpoint: its architecture, or its text part's."""
        return str(self.hf["architectures"][0])


@dataclass(frozen=True)
class ModelSpec:
    """Shapes a built model reports to the engine; kv heads are those held by this rank."""

    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    # Multi-head latent attention: each layer caches one `head_dim`-wide row per token (a single "kv head") whose first
    # `latent_dim` features are the compressed latent and the rest the rotary key. None: keys and values per kv head.
    latent_dim: int | None = None
    # A hybrid model: one sequence's state in each recurrent layer, in layer order (`num_layers` counts only the
    # layers with paged keys and values). Empty: every layer attends over the paged cache.
    state_shapes: tuple[tuple[int, ...], ...] = ()
    # Per entry of `state_shapes`, the dtype its pool must hold whatever the model's (Gated DeltaNet's float32
    # delta-rule state); None, or no entry: the model's dtype.
    state_dtypes: tuple[torch.dtype | None, ...] = ()
    # Per layer that keeps a cache, its (kv heads held by this rank, head_dim), when layers differ (Gemma 4's global
    # layers have wider heads, and its KV-sharing layers read another layer's cache); None: `num_layers` layers of
    # (`num_kv_heads`, `head_dim`).
    cache_layers: tuple[tuple[int, int], ...] | None = None

    @property
    def cache_shapes(self) -> tuple[tuple[int, int], ...]:
        """(kv heads, head_dim) of every cached layer, in the order the model reads the caches."""
        if self.cache_layers is not None:
            return self.cache_layers
        return ((self.num_kv_heads, self.head_dim),) * self.num_layers


def read_checkpoint_config(model_path: Path) -> CheckpointConfig:
    """Parses `model_path/config.json` (required) and `generation_config.json` (optional)."""
    config_file = model_path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{config_file} not found; --model-path must be a checkpoint directory")
    hf = json.loads(config_file.read_text())
    architectures = hf.get("architectures") or []
    if not architectures:
        raise ConfigError(f"{config_file} names no architecture (`architectures` is empty)")
    text_part = TEXT_PARTS.get(architectures[0])
    skipped_parts: tuple[str, ...] = ()
    whole_hf = None
    if text_part is not None:
        skipped_parts = tuple(text_part.skipped_parts(hf))
        whole_hf, hf = hf, text_part.text_config(hf)
    eos = _as_ids(hf.get("eos_token_id"))
    generation_file = model_path / "generation_config.json"
    if generation_file.is_file():
        eos += tuple(i for i in _as_ids(json.loads(generation_file.read_text()).get("eos_token_id")) if i not in eos)
    quantization = hf.get("quantization_config") or {}
    int4 = checkpoint_int4_scheme(quantization) if quantization.get("quant_method") in INT4_METHODS else None
    mxfp4 = is_mxfp4(quantization)
    return CheckpointConfig(
        path=model_path,
        hf=hf,
        architecture=architectures[0],
        eos_token_ids=eos,
        fp8=None if int4 is not None or mxfp4 else checkpoint_fp8_scheme(hf),
        int4=int4,
        num_experts=num_experts(hf),
        mxfp4=mxfp4,
        text_part=text_part,
        skipped_parts=skipped_parts,
        whole_hf=whole_hf,
    )


def num_experts(hf: dict[str, Any]) -> int:
    """Routed experts per MoE layer as config.json spells them (`num_local_experts`, `num_experts` or
    `n_routed_experts`); 0: dense."""
    return int(hf.get("num_local_experts") or hf.get("num_experts") or hf.get("n_routed_experts") or 0)


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(dict.fromkeys(int(v) for v in value))
