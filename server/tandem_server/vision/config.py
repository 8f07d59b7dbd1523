"""Vision towers' sizes (CLIP's, SigLIP's) and a LLaVA checkpoint's vision settings: the hidden states its projector
reads, and the image token whose prompt positions take the projected embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError

# CLIPVisionConfig's defaults, for published configs that list only what differs from them (llava-1.5's do).
CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}

# SiglipVisionConfig's defaults, for published configs that list only what differs from them (Gemma 3's do).
SIGLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}

# LlavaConfig's defaults for the settings the vision side reads.
LLAVA_DEFAULTS: dict[str, Any] = {
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": True,
    "image_token_index": 32000,
}

SELECT_STRATEGIES = ("default", "full")

# Gemma3Config's defaults for the settings the vision side reads.
GEMMA3_DEFAULTS: dict[str, Any] = {
    "mm_tokens_per_image": 256,
    "image_token_index": 262_144,
}


@dataclass(frozen=True)
class VitArgs:
    """The sizes of a vision transformer (CLIP's or SigLIP's)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    hidden_act: str
    layer_norm_eps: float

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class LlavaArgs:
    """Everything LLaVA's vision side reads from config.json."""

    vision: VitArgs
    # Indices into the tower's hidden states (0: the embeddings after `pre_layrnorm`, i: layer i's output), whose
    # features are concatenated per token before the projector.
    feature_layers: tuple[int, ...]
    # "full" keeps the class token's features; "default" drops them.
    keep_class_token: bool
    projector_act: str
    projector_bias: bool
    text_hidden_size: int
    image_token_id: int

    @property
    def depth(self) -> int:
        """The tower layers that run: those up to the deepest hidden state read."""
        return max(self.feature_layers)

    @property
    def tokens_per_image(self) -> int:
        """The embeddings one image becomes, and so the prompt positions its span holds."""
        return self.vision.num_patches + int(self.keep_class_token)


def vit_args(vision_config: dict[str, Any], model_type: str, defaults: dict[str, Any]) -> VitArgs:
    """A vision config of `model_type` over that type's `defaults`."""
    hf = {**defaults, **vision_config}
    if hf.get("model_type", model_type) != model_type:
        raise ConfigError(f"unsupported vision tower {hf['model_type']!r}; supported: {model_type}")
    return VitArgs(
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=int(hf["num_attention_heads"]),
        num_channels=int(hf["num_channels"]),
        image_size=int(hf["image_size"]),
        patch_size=int(hf["patch_size"]),
        hidden_act=str(hf["hidden_act"]),
        layer_norm_eps=float(hf["layer_norm_eps"]),
    )


def llava_args(hf: dict[str, Any], text_hidden_size: int) -> LlavaArgs:
    """LLaVA's vision settings from its whole config.json; `text_hidden_size` is its text decoder's."""
    vision_config = hf.get("vision_config")
    if not isinstance(vision_config, dict):
        raise ConfigError("a LlavaForConditionalGeneration checkpoint needs `vision_config` in config.json")
    settings = {**LLAVA_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    vision = vit_args(vision_config, "clip_vision_model", CLIP_VISION_DEFAULTS)
    strategy = settings["vision_feature_select_strategy"]
    if strategy not in SELECT_STRATEGIES:
        raise ConfigError(f"vision_feature_select_strategy {strategy!r}; supported: {', '.join(SELECT_STRATEGIES)}")
    return LlavaArgs(
        vision=vision,
        feature_layers=feature_layers(settings["vision_feature_layer"], vision.num_layers),
        keep_class_token=strategy == "full",
        projector_act=str(settings["projector_hidden_act"]),
        projector_bias=bool(settings["multimodal_projector_bias"]),
        text_hidden_size=text_hidden_size,
        image_token_id=int(settings.get("image_token_id", settings["image_token_index"])),
    )


@dataclass(frozen=True)
class Gemma3VisionArgs:
    """Everything Gemma 3's vision side reads from config.json."""

    vision: VitArgs
    # The embeddings one image becomes: its patch grid average-pooled to a square this many cells in all.
    tokens_per_image: int
    image_token_id: int

    @property
    def patches_per_side(self) -> int:
        return self.vision.image_size // self.vision.patch_size

    @property
    def pool_size(self) -> int:
        """The side, in patches, of the square each embedding averages."""
        return self.patches_per_side // math.isqrt(self.tokens_per_image)


def gemma3_vision_args(hf: dict[str, Any]) -> Gemma3VisionArgs:
    """Gemma 3's vision settings from its whole config.json; the pooled grid must tile the patch grid exactly."""
    vision_config = hf.get("vision_config")
    if not isinstance(vision_config, dict):
        raise ConfigError("a Gemma3ForConditionalGeneration checkpoint needs `vision_config` in config.json")
    settings = {**GEMMA3_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    args = Gemma3VisionArgs(
        vision=vit_args(vision_config, "siglip_vision_model", SIGLIP_VISION_DEFAULTS),
        tokens_per_image=int(settings["mm_tokens_per_image"]),
        image_token_id=int(settings.get("image_token_id", settings["image_token_index"])),
    )
    side = math.isqrt(args.tokens_per_image)
    if side < 1 or side * side != args.tokens_per_image or args.patches_per_side % side:
        raise ConfigError(
            f"mm_tokens_per_image {args.tokens_per_image} does not pool the {args.patches_per_side}x"
            f"{args.patches_per_side} patch grid into a square of equal cells"
        )
    return args


def feature_layers(selection: int | list[int], num_layers: int) -> tuple[int, ...]:
    """`vision_feature_layer` (one index or a list, Python-style over the tower's `num_layers + 1` hidden states) as
    non-negative indices."""
    chosen = [selection] if isinstance(selection, int) else list(selection)
    count = num_layers + 1
    if not chosen or any(not -count <= int(index) < count for index in chosen):
        raise ConfigError(f"vision_feature_layer {selection!r} is outside the tower's {count} hidden states")
    return tuple(int(index) % count for index in chosen)
