"""The text decoder inside a multimodal (conditional-generation) checkpoint, served by its text family alone."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tandem_server.errors import ConfigError
from tandem_server.weights.layout import CheckpointLayout, Renamed

# Top-level settings of a multimodal config.json that hold for its text decoder when the text config does not say.
INHERITED_KEYS = ("quantization_config", "eos_token_id", "tie_word_embeddings", "max_position_embeddings")


@dataclass(frozen=True)
class TextPart:
    """Where a conditional-generation checkpoint keeps its language model: the text family that serves it (None: the
    one its text configuration's `model_type` names), the config key of its text configuration, and the checkpoint
    prefixes of its weights, each paired with the prefix the text family's parameters use. Tensors under no listed
    prefix (encoders, projectors) are never read by the text family."""

    text_architecture: str | None
    prefixes: tuple[tuple[str, str], ...]
    config_key: str = "text_config"
    # The text configuration's defaults, for published configs that list only what differs from them (for a family
    # named by `model_type`: that model type's defaults).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # Sub-models the shard serves beside the text decoder (`vision_config` gives "vision").
    served_parts: tuple[str, ...] = ()
    # Whether a config.json without the text configuration keeps the text settings at its top level (Qwen2.5-VL as
    # published).
    text_at_top_level: bool = False

    def text_config(self, hf: dict[str, Any]) -> dict[str, Any]:
        """The text decoder's configuration, with the top level's settings it does not override, over its defaults;
        its `architectures` names the text family that serves it."""
        text = hf.get(self.config_key)
        if text is None and self.text_at_top_level:
            text = _top_level_text(hf)
        if not isinstance(text, dict):
            raise ConfigError(f"a {hf['architectures'][0]} checkpoint needs `{self.config_key}` in config.json")
        inherited = {key: hf[key] for key in INHERITED_KEYS if key in hf and key not in text}
        architecture = self.text_architecture or _family_of_model_type(text, hf["architectures"][0])
        defaults = self.defaults if self.text_architecture else MODEL_TYPE_DEFAULTS.get(str(text.get("model_type")), {})
        return {**defaults, **inherited, **text, "architectures": [architecture]}

    def checkpoint_layout(self, layout: CheckpointLayout) -> CheckpointLayout:
        """The text family's `layout` read from under this checkpoint's text prefixes, everything else skipped."""
        renamed = tuple(Renamed("^" + re.escape(source), target) for source, target in self.prefixes)
        kept = tuple(source for source, _ in self.prefixes)
        return replace(layout, kept_prefixes=kept, renamed=renamed + layout.renamed)

    def skipped_parts(self, hf: dict[str, Any]) -> list[str]:
        """The other sub-models config.json declares (`vision_config` gives "vision") that the shard does not load."""
        own = (self.config_key, "quantization_config", *(f"{part}_config" for part in self.served_parts))
        others = (key for key, value in hf.items() if key.endswith("_config") and isinstance(value, dict))
        return sorted(key.removesuffix("_config") for key in others if key not in own)


def _top_level_text(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json's own settings without its sub-model configurations."""
    return {
        key: value
        for key, value in hf.items()
        if key == "quantization_config" or not (key.endswith("_config") and isinstance(value, dict))
    }


def _family_of_model_type(text: dict[str, Any], architecture: str) -> str:
    model_type = text.get("model_type")
    if model_type not in TEXT_FAMILIES:
        supported = ", ".join(sorted(TEXT_FAMILIES))
        raise ConfigError(f"{architecture}: its text model type {model_type!r} is not served; supported: {supported}")
    return TEXT_FAMILIES[model_type]


# The text families a text configuration's `model_type` names, where the checkpoint's architecture does not fix one.
TEXT_FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# LlamaConfig's defaults for the sizes the Llama family reads: llava-1.5's published configs give only the sizes
# that differ.
LLAMA_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 11_008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {"llama": LLAMA_TEXT_DEFAULTS}


# Gemma3TextConfig's defaults for the sizes Gemma 3's family reads: the published multimodal configs (gemma-3-4b-it,
# say) give only the sizes that differ.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131_072,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
}

# transformers 5 saves the text decoder under `model.language_model.`; the older layout (Gemma 3 as published) under
# `language_model.model.` with its head at `language_model.lm_head.`. Gemma 3's and LLaVA's vision towers and
# projectors are served beside their text decoders (vision/gemma3.py, vision/llava.py).
TEXT_PARTS: dict[str, TextPart] = {
    "Gemma3ForConditionalGeneration": TextPart(
        "Gemma3ForCausalLM",
        (
            ("model.language_model.", "model."),
            ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."),
            ("lm_head.", "lm_head."),
        ),
        defaults=GEMMA3_TEXT_DEFAULTS,
        served_parts=("vision",),
    ),
    "Gemma4ForConditionalGeneration": TextPart(
        "Gemma4ForCausalLM", (("model.language_model.", "model."), ("lm_head.", "lm_head."))
    ),
    # The published Qwen3.5 checkpoints; their multi-token prediction layers (`mtp.`) are skipped with the vision tower.
    "Qwen3_5ForConditionalGeneration": TextPart(
        "Qwen3_5ForCausalLM", (("model.language_model.", "model."), ("lm_head.", "lm_head."))
    ),
    "Qwen3_5MoeForConditionalGeneration": TextPart(
        "Qwen3_5MoeForCausalLM", (("model.language_model.", "model."), ("lm_head.", "lm_head."))
    ),
    # transformers 5 saves the vision tower as `model.visual.`, the published checkpoints as `visual.`; both beside the
    # text decoder's `model.` parts, which are listed one by one so the tower is not read as text.
    "Qwen2_5_VLForConditionalGeneration": TextPart(
        "Qwen2ForCausalLM",
        (
            ("model.language_model.", "model."),
            ("model.embed_tokens.", "model.embed_tokens."),
            ("model.layers.", "model.layers."),
            ("model.norm.", "model.norm."),
            ("lm_head.", "lm_head."),
        ),
        served_parts=("vision",),
        text_at_top_level=True,
    ),
    "LlavaForConditionalGeneration": TextPart(
        None,
        (
            ("model.language_model.", "model."),
            ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."),
            ("lm_head.", "lm_head."),
        ),
        served_parts=("vision",),
    ),
}
