"""Quantized weight values before any kernel layout: int4 groups, int8 and float8 channels, and quantizers for float
weights.

- int4: `w = (q - INT4_MIDPOINT) * scale + zero` per group of input features (`INT4_GROUP` when quantized at load, a
  checkpoint's own size for GPTQ/AWQ), q in 0..15.
- int8: `w = q * scale` per output channel, q in -127..127.
- fp8: `w = q * scale` per output channel, or per output channel and run of `input_group` input features (a
  block-wise checkpoint's scales widened to rows), q a float8 e4m3 value (at most `FP8_MAX` in magnitude).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

INT4_GROUP = 32
# The group sizes torch's CPU int4 kernel takes.
INT4_KERNEL_GROUPS = (32, 64, 128, 256)
# torch's CPU int4 packing takes output features in multiples of 16.
INT4_OUT_MULTIPLE = 16
INT4_MIDPOINT = 8
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max


@dataclass(frozen=True)
class Int4Groups:
    """Unpacked int4 weights `[out, in]` (values 0..15) with float32 `scale` and `zero` `[out, in / group_size]`;
    `group_size` is one the CPU kernel takes (`INT4_KERNEL_GROUPS`).

    `input_order` (an act-order GPTQ checkpoint's): the input feature at each of `q`'s columns, which then run group by
    group; the GEMM takes its activations in that order. None: columns in input order.
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int = INT4_GROUP
    input_order: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """The float32 `[out, in]` weight, columns in input order."""
        out_features, in_features = self.q.shape
        grouped = (self.q.view(out_features, -1, self.group_size).float() - INT4_MIDPOINT) * self.scale.unsqueeze(-1)
        weight = (grouped + self.zero.unsqueeze(-1)).view(out_features, in_features)
        if self.input_order is None:
            return weight
        return torch.empty_like(weight).index_copy_(1, self.input_order, weight)

    def to(self, device: torch.device) -> Int4Groups:
        order = None if self.input_order is None else self.input_order.to(device)
        return replace(
            self, q=self.q.to(device), scale=self.scale.to(device), zero=self.zero.to(device), input_order=order
        )

    @staticmethod
    def concat(parts: list[Int4Groups]) -> Int4Groups:
        """Parts stacked along the output features (a fused projection); they share one group size."""
        sizes = {part.group_size for part in parts}
        if len(sizes) > 1:
            raise ValueError(f"stacked int4 parts have different group sizes {sorted(sizes)}")
        order = parts[0].input_order
        if any(not _same_order(part.input_order, order) for part in parts[1:]):
            raise ValueError("stacked int4 parts order their input features differently (act-order)")
        return Int4Groups(
            torch.cat([part.q for part in parts]),
            torch.cat([part.scale for part in parts]),
            torch.cat([part.zero for part in parts]),
            sizes.pop(),
            order,
        )


def _same_order(first: torch.Tensor | None, second: torch.Tensor | None) -> bool:
    if first is None or second is None:
        return first is second
    return torch.equal(first, second)


@dataclass(frozen=True)
class Int8Channels:
    """int8 weights `[out, in]` with one float32 scale per output channel."""

    q: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.unsqueeze(-1)

    @staticmethod
    def concat(parts: list[Int8Channels]) -> Int8Channels:
        return Int8Channels(torch.cat([part.q for part in parts]), torch.cat([part.scale for part in parts]))


@dataclass(frozen=True)
class Int8Groups:
    """int8 weights `[out, in]` with a float32 scale per group of `INT4_GROUP` input features (GGUF's Q8_0)."""

    q: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        out_features, in_features = self.q.shape
        grouped = self.q.view(out_features, -1, INT4_GROUP).float() * self.scale.unsqueeze(-1)
        return grouped.view(out_features, in_features)

    def nibble_planes(self) -> tuple[Int4Groups, Int4Groups]:
        """Two int4 weights whose sum is exactly these: with q + 128 = 16 high + low,
        q d = ((high - 8) 16d + 8d) + (low - 8) d."""
        unsigned = (self.q.to(torch.int16) + 128).to(torch.uint8)
        high = Int4Groups(unsigned >> 4, 16 * self.scale, INT4_MIDPOINT * self.scale)
        low = Int4Groups(unsigned & 0x0F, self.scale, torch.zeros_like(self.scale))
        return high, low

    @staticmethod
    def concat(parts: list[Int8Groups]) -> Int8Groups:
        return Int8Groups(torch.cat([part.q for part in parts]), torch.cat([part.scale for part in parts]))


def quantize_int4(weight: torch.Tensor) -> Int4Groups:
    """Asymmetric groupwise int4 (min to max of each group of `INT4_GROUP` input features on 16 levels)."""
    out_features, in_features = weight.shape
    if in_features % INT4_GROUP:
        raise ValueError(f"int4 needs input features in multiples of {INT4_GROUP}, this weight has {in_features}")
    groups = weight.float().view(out_features, -1, INT4_GROUP)
    low = groups.amin(-1)
    high = groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    q = ((groups - low.unsqueeze(-1)) / scale.unsqueeze(-1)).round_().clamp_(0, 15).to(torch.uint8)
    return Int4Groups(q.view(out_features, in_features), scale, low + INT4_MIDPOINT * scale)


def quantize_int8(weight: torch.Tensor) -> Int8Channels:
    """Symmetric per-output-channel int8 (each row's largest magnitude maps to 127)."""
    rows = weight.float()
    scale = (rows.abs().amax(-1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = (rows / scale.unsqueeze(-1)).round_().clamp_(-127, 127).to(torch.int8)
    return Int8Channels(q, scale)


@dataclass(frozen=True)
class Fp8Channels:
    """float8 e4m3 weights `[out, in]` with float32 scales per output channel (`[out]`), or per output channel and
    run of `input_group` input features (`[out, ceil(in / input_group)]`, the last run possibly shorter).

    `input_scale`: a checkpoint's static activation scale for the whole tensor; None scales each token (each run of
    `input_group` features of a token, when grouped) by its own largest magnitude, capped at `activation_bound` when
    that is set (FBGEMM's `activation_scale_ub`).
    """

    q: torch.Tensor
    scale: torch.Tensor
    input_scale: float | None = None
    activation_bound: float | None = None
    input_group: int | None = None

    def dequantize(self) -> torch.Tensor:
        if self.input_group is None:
            return self.q.float() * self.scale.float().unsqueeze(-1)
        widened = self.scale.float().repeat_interleave(self.input_group, dim=-1)
        return self.q.float() * widened[:, : self.q.shape[1]]

    def to(self, device: torch.device) -> Fp8Channels:
        return replace(self, q=self.q.to(device), scale=self.scale.to(device))

    @staticmethod
    def concat(parts: list[Fp8Channels]) -> Fp8Channels:
        """Parts stacked along the output features; they share one input, so one activation scale: the largest
        static scale (no part's range is clipped), or per token when any part scales per token."""
        groups = {part.input_group for part in parts}
        if len(groups) > 1:
            raise ValueError(f"stacked float8 parts scale different runs of input features: {sorted(map(str, groups))}")
        static = [part.input_scale for part in parts]
        bounds = [part.activation_bound for part in parts if part.activation_bound is not None]
        return Fp8Channels(
            torch.cat([part.q for part in parts]),
            torch.cat([part.scale for part in parts]),
            None if None in static else max(scale for scale in static if scale is not None),
            max(bounds) if bounds else None,
            groups.pop(),
        )


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def quantize_fp8(weight: torch.Tensor) -> Fp8Channels:
    """Symmetric per-output-channel float8 e4m3 (each row's largest magnitude maps to `FP8_MAX`)."""
    rows = weight.float()
    scale = (rows.abs().amax(-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    q = (rows / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Channels(q, scale)
