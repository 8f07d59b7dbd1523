"""Qwen2.5-VL's vision side: a vision transformer over an image's patches at its own resolution (two-axis rotary,
attention within windows but in a few full layers, RMSNorms, gated MLPs), then a merger projecting each square of
merge_size x merge_size patches into one embedding of the text decoder. The text decoder's rotary positions follow
each image's grid of merged patches (M-RoPE), so the family reports the grid an image becomes.

Every rank holds all of it (no tensor-parallel slicing): an image is encoded once per rank, identically.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.layers.activation import activation
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rotary import RotaryAngles
from tandem_server.vision.image_encoder import ImageEncoder
from tandem_server.vision.qwen2_5_vl_config import VISION_NORM_EPS, Qwen2_5_VisionArgs, qwen2_5_vision_args
from tandem_server.weights.layout import CheckpointLayout, Renamed

# transformers 5 saves the tower under `model.visual.`, the published checkpoints under `visual.`.
TOWER_NAMES = Renamed(r"^model\.visual\.", "visual.")

Grid = tuple[int, int, int]


@dataclass(frozen=True)
class WindowLayout:
    """The order the tower runs an image's patches in: its merged units grouped by attention window, row-major
    within each, and for every patch in that order the window and the frame it belongs to."""

    unit_order: torch.Tensor
    windows: torch.Tensor
    frames: torch.Tensor


def window_layout(grid: Grid, merge_size: int, window_units: int) -> WindowLayout:
    """The window layout of a `grid` (frames, patch rows, patch columns) of patches, merged in squares of
    `merge_size`, in windows of `window_units` x `window_units` merged units (clipped at the grid's edges)."""
    frames, height, width = grid
    rows, columns = height // merge_size, width // merge_size
    frame, row, column = (
        axis.flatten()
        for axis in torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(columns), indexing="ij")
    )
    window_rows, window_columns = -(-rows // window_units), -(-columns // window_units)
    window = (frame * window_rows + row // window_units) * window_columns + column // window_units
    within = (row % window_units) * window_units + column % window_units
    order = torch.argsort(window * window_units**2 + within)
    unit = merge_size * merge_size
    return WindowLayout(order, window[order].repeat_interleave(unit), frame[order].repeat_interleave(unit))


@dataclass(frozen=True)
class Segments:
    """Patches in contiguous runs that attend only within their own run, as a padded batch: `index[s, i]` is the
    i-th patch of run s where `valid[s, i]` (padding repeats patch 0). None: one run holds every patch."""

    index: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @classmethod
    def of(cls, runs: torch.Tensor) -> Segments:
        """The segments of `runs`, each patch's run id, equal ids adjacent."""
        counts = torch.unique_consecutive(runs, return_counts=True)[1]
        if len(counts) == 1:
            return cls()
        offsets = torch.arange(int(counts.max()), device=runs.device)
        valid = offsets.unsqueeze(0) < counts.unsqueeze(1)
        starts = (torch.cumsum(counts, 0) - counts).unsqueeze(1)
        return cls(torch.where(valid, starts + offsets, 0), valid)


def patch_positions(grid: Grid, merge_size: int) -> torch.Tensor:
    """The (row, column) `[patches, 2]` of every patch in the image processor's order: frame by frame, merged units
    row-major, each unit's patches row-major."""
    frames, height, width = grid
    rows = torch.arange(height).view(-1, 1).expand(height, width)
    columns = torch.arange(width).view(1, -1).expand(height, width)
    blocks = (height // merge_size, merge_size, width // merge_size, merge_size)
    by_unit = [axis.reshape(blocks).transpose(1, 2).flatten() for axis in (rows, columns)]
    return torch.stack(by_unit, dim=-1).repeat(frames, 1)


class VisionRotary:
    """Two-axis rotary: the first half of each head's pairs rotate by the patch's row, the second by its column.
    Its frequencies are computed per image rather than kept in a buffer, as the tower is built on the meta device."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        self.axis_dim = args.head_dim // 2
        self.theta = args.rope_theta

    def angles(self, positions: torch.Tensor, device: torch.device) -> RotaryAngles:
        """The float32 rotation of patches at `positions` `[patches, 2]`, on `device`."""
        exponents = torch.arange(0, self.axis_dim, 2, dtype=torch.float32, device=device) / self.axis_dim
        inv_freq = 1.0 / (self.theta**exponents)
        angles = (positions.to(device).float().unsqueeze(-1) * inv_freq).flatten(1)
        cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
        return RotaryAngles(torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention within each segment, queries and keys rotated in float32."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.qkv = nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.proj = nn.Linear(args.hidden_size, args.hidden_size)

    def forward(self, hidden: torch.Tensor, rotation: RotaryAngles, segments: Segments) -> torch.Tensor:
        patches = hidden.shape[0]
        query, key, value = self.qkv(hidden).view(patches, 3, self.num_heads, self.head_dim).unbind(1)
        query, key = (rotation.rotate(x.float()).to(x.dtype) for x in (query, key))
        scale = self.head_dim**-0.5
        if segments.index is None or segments.valid is None:
            query, key, value = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))
            attended = F.scaled_dot_product_attention(query, key, value, scale=scale)[0].transpose(0, 1)
        else:
            query, key, value = (x[segments.index].transpose(1, 2) for x in (query, key, value))
            keys_valid = segments.valid.view(segments.valid.shape[0], 1, 1, -1)
            padded = F.scaled_dot_product_attention(query, key, value, attn_mask=keys_valid, scale=scale)
            attended = padded.transpose(1, 2)[segments.valid]
        return self.proj(attended.reshape(patches, -1))


class VisionMlp(nn.Module):
    """`down(act(gate(x)) * up(x))`, every projection biased."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size)
        self.act = activation(args.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(hidden)) * self.up_proj(hidden))


class VisionBlock(nn.Module):
    """Pre-norm attention and MLP, each with a residual connection."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        self.norm1 = RMSNorm(args.hidden_size, VISION_NORM_EPS)
        self.attn = VisionAttention(args)
        self.norm2 = RMSNorm(args.hidden_size, VISION_NORM_EPS)
        self.mlp = VisionMlp(args)

    def forward(self, hidden: torch.Tensor, rotation: RotaryAngles, segments: Segments) -> torch.Tensor:
        hidden = hidden + self.attn(self.norm1(hidden), rotation, segments)
        return hidden + self.mlp(self.norm2(hidden))


class PatchEmbed(nn.Module):
    """Each patch (channels x frames x side x side values) projected to the hidden size, without bias."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        kernel = (args.temporal_patch_size, args.patch_size, args.patch_size)
        self.patch_shape = (args.in_channels, *kernel)
        self.proj = nn.Conv3d(args.in_channels, args.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = pixel_values.to(self.proj.weight.dtype).view(-1, *self.patch_shape)
        return self.proj(patches).flatten(1)


class PatchMerger(nn.Module):
    """Each merged unit's patches, RMS-normalised, concatenated and passed through a two-layer GELU MLP."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        merged = args.hidden_size * args.merge_size**2
        self.merged = merged
        self.ln_q = RMSNorm(args.hidden_size, VISION_NORM_EPS)
        self.mlp = nn.Sequential(nn.Linear(merged, merged), nn.GELU(), nn.Linear(merged, args.out_hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(hidden).view(-1, self.merged))


class Qwen2_5_VisionTower(nn.Module):
    """Patch embedding, the blocks and the merger; parameter names follow the checkpoint's `visual.*`."""

    def __init__(self, args: Qwen2_5_VisionArgs) -> None:
        super().__init__()
        self.args = args
        self.patch_embed = PatchEmbed(args)
        self.rotary = VisionRotary(args)
        self.blocks = nn.ModuleList(VisionBlock(args) for _ in range(args.depth))
        self.merger = PatchMerger(args)

    def forward(self, pixel_values: torch.Tensor, grid: Grid) -> torch.Tensor:
        """The embeddings `[merged units, out hidden]`, row-major over the merged grid, of one image's patches in the
        image processor's order."""
        args = self.args
        unit = args.merge_size**2
        layout = window_layout(grid, args.merge_size, args.window_units)
        order = layout.unit_order.to(pixel_values.device)
        hidden = self.patch_embed(pixel_values)
        hidden = hidden.view(-1, unit, hidden.shape[-1])[order].flatten(0, 1)
        positions = patch_positions(grid, args.merge_size).view(-1, unit, 2)[layout.unit_order].flatten(0, 1)
        rotation = self.rotary.angles(positions, hidden.device)
        windows, frames = Segments.of(layout.windows.to(hidden.device)), Segments.of(layout.frames.to(hidden.device))
        for index, block in enumerate(self.blocks):
            hidden = block(hidden, rotation, frames if index in args.full_attention_layers else windows)
        return self.merger(hidden)[torch.argsort(order)]


class Qwen2_5_VLImageEncoder(ImageEncoder):
    """The vision transformer and its merger at each image's own resolution; an image's tokens form its grid of
    merged patches, which the text decoder's rotary positions follow."""

    grid_positions = True

    def __init__(self, hf_config: dict[str, Any], text_hidden_size: int) -> None:
        super().__init__()
        args = qwen2_5_vision_args(hf_config, text_hidden_size)
        self.image_size = None
        self.image_token_id = args.image_token_id
        self.description = f"Qwen2_5_VisionTransformer, {args.depth} layers"
        self.visual = Qwen2_5_VisionTower(args)

    def forward(self, pixels: Mapping[str, torch.Tensor]) -> torch.Tensor:
        frames, height, width = (int(size) for size in pixels["image_grid_thw"][0].tolist())
        return self.visual(pixels["pixel_values"], (frames, height, width))

    def token_grid(self, processor: Any, width: int, height: int) -> tuple[int, int]:
        """The image processor's own resize rule (to multiples of patch_size x merge_size, the pixel count within
        its size's shortest_edge and longest_edge), in merged units."""
        # Imported here, as the image processor itself is (vision/preprocess.py).
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # noqa: PLC0415

        factor = int(processor.patch_size) * int(processor.merge_size)
        size = processor.size
        resized_height, resized_width = smart_resize(
            height, width, factor, min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"])
        )
        return resized_height // factor, resized_width // factor

    def checkpoint_layout(self) -> CheckpointLayout:
        """The tower and merger under either naming."""
        return CheckpointLayout(kept_prefixes=("visual.", "model.visual."), renamed=(TOWER_NAMES,))
