"""Qwen2.5-VL's vision settings from config.json: its window-attention vision transformer and the patch merger that
feeds the text decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError

# Qwen2_5_VLVisionConfig's defaults, for published configs that list only what differs from them.
QWEN2_5_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": (7, 15, 23, 31),
}
# Qwen2_5_VLConfig's image token, and the theta of the tower's two-axis rotary.
QWEN2_5_VL_IMAGE_TOKEN_ID = 151_655
VISION_ROPE_THETA = 10_000.0
# Every RMSNorm of the tower and the merger.
VISION_NORM_EPS = 1e-6


@dataclass(frozen=True)
class Qwen2_5_VisionArgs:
    """Everything Qwen2.5-VL's vision side reads from config.json."""

    depth: int
    hidden_size: int
    hidden_act: str
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    # Each token the text decoder reads merges a square of merge_size x merge_size patches.
    merge_size: int
    # Frames per patch: an image is its one frame repeated this many times.
    temporal_patch_size: int
    # The side, in pixels, of the windows the windowed layers attend within.
    window_size: int
    out_hidden_size: int
    # The layers that attend over the whole image; the others attend within windows.
    full_attention_layers: frozenset[int]
    rope_theta: float
    image_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window_units(self) -> int:
        """The side of an attention window, in merged units."""
        return self.window_size // self.merge_size // self.patch_size


def qwen2_5_vision_args(hf: dict[str, Any], text_hidden_size: int) -> Qwen2_5_VisionArgs:
    """Qwen2.5-VL's vision settings from its whole config.json; the merger must feed `text_hidden_size`."""
    vision_config = hf.get("vision_config")
    if not isinstance(vision_config, dict):
        raise ConfigError("a Qwen2_5_VLForConditionalGeneration checkpoint needs `vision_config` in config.json")
    vision = {**QWEN2_5_VL_VISION_DEFAULTS, **{key: value for key, value in vision_config.items() if value is not None}}
    rope = vision.get("rope_parameters") or {}
    args = Qwen2_5_VisionArgs(
        depth=int(vision["depth"]),
        hidden_size=int(vision["hidden_size"]),
        hidden_act=str(vision["hidden_act"]),
        intermediate_size=int(vision["intermediate_size"]),
        num_heads=int(vision["num_heads"]),
        in_channels=int(vision["in_channels"]),
        patch_size=int(vision["patch_size"]),
        merge_size=int(vision["spatial_merge_size"]),
        temporal_patch_size=int(vision["temporal_patch_size"]),
        window_size=int(vision["window_size"]),
        out_hidden_size=int(vision["out_hidden_size"]),
        full_attention_layers=frozenset(int(index) for index in vision["fullatt_block_indexes"]),
        rope_theta=float(rope.get("rope_theta", VISION_ROPE_THETA)),
        image_token_id=int(hf.get("image_token_id") or QWEN2_5_VL_IMAGE_TOKEN_ID),
    )
    if args.out_hidden_size != text_hidden_size:
        raise ConfigError(
            f"the vision merger's out_hidden_size {args.out_hidden_size} is not the text decoder's hidden size "
            f"{text_hidden_size}"
        )
    if args.window_units < 1 or args.head_dim % 4:
        raise ConfigError(
            f"window_size {args.window_size} holds no {args.merge_size}x{args.merge_size} merged patch, or the vision "
            f"heads' size {args.head_dim} does not split into two rotary axes of pairs"
        )
    return args
