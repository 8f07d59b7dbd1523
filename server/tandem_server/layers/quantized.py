"""Quantized GEMMs: on CPU int4 groupwise and int8 per-channel weights with bfloat16 activations (weight-only), on
CUDA int4 groupwise weights through Tandem's Triton kernel (`int4_triton`), and float8 e4m3 weights with float8
activations through `torch._scaled_mm` (CPU, and CUDA from compute capability 8.9).

torch's CPU weight-only kernels read 0.5 (int4) or 1 (int8) byte per weight instead of 4, which is what a decode step
at small batches is bound by; they are fast only with bfloat16 activations, so each GEMM casts its input to bfloat16
and its output back to the model's dtype.
- int4: `w = (q - 8) * scale + zero` per group of 32 to 256 input features, q in 0..15, scale and zero in bfloat16.
- int8: `w = q * scale` per output channel, q in -127..127, scale in bfloat16.
- fp8: `w = q * scale` per output channel (or per output channel and run of input features), float32 scales;
  activations scaled per token (per token and run; or by a checkpoint's static scale) into float8, the product
  accumulated in float32. On CUDA one `_scaled_mm` per linear, its scales laid out once at load (`Fp8Recipe`).
"""

from __future__ import annotations

import enum
import importlib.util

import torch
import torch.nn.functional as F

from tandem_server.layers.int4_layout import PackedLayout, packed_block
from tandem_server.weights.fp8_blocks import GEMM_BLOCK, gemm_block_scales, requantize_rows
from tandem_server.weights.quantization import (
    FP8_DTYPE,
    FP8_MAX,
    INT4_MIDPOINT,
    INT4_OUT_MULTIPLE,
    Fp8Channels,
    Int4Groups,
    Int8Channels,
    Int8Groups,
    QuantizeMode,
    quantize_int8,
)

ACTIVATION_DTYPE = torch.bfloat16


class Int4Weight:
    """An int4 groupwise weight packed for `torch._weight_int4pack_mm_for_cpu`.

    From `DENSE_MIN_ROWS` rows on (prefill chunks), each GEMM instead unpacks the weight to float and multiplies
    densely, which is faster there; both paths multiply by the same values.
    """

    def __init__(self, groups: Int4Groups) -> None:
        self.out_features, self.in_features = groups.q.shape
        if self.out_features % INT4_OUT_MULTIPLE:
            raise ValueError(
                f"the int4 kernel needs output features in multiples of {INT4_OUT_MULTIPLE}, this weight has "
                f"{self.out_features}"
            )
        self.group_size = groups.group_size
        self.input_order = groups.input_order
        self.packed = torch._convert_weight_to_int4pack_for_cpu(groups.q.to(torch.int32), 1)
        # The kernel reads [in / group, out, 2]: each group's scale and zero for every output feature.
        self.scales_and_zeros = torch.stack([groups.scale.t(), groups.zero.t()], dim=-1).to(ACTIVATION_DTYPE)
        self.nbytes = _nbytes(self.packed) + _nbytes(self.scales_and_zeros)
        block = packed_block()
        self.layout = None if block is None else PackedLayout(block, self.out_features, self.in_features)
        self.unpackable = self.layout is not None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        if x.shape[0] >= DENSE_MIN_ROWS and self.unpackable:
            return F.linear(x, self.dequantize().to(x.dtype), bias)
        out = torch._weight_int4pack_mm_for_cpu(
            x.to(ACTIVATION_DTYPE), self.packed, self.group_size, self.scales_and_zeros
        )
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def dequantize(self) -> torch.Tensor:
        """The float32 `[out, in]` weight the kernel multiplies by, columns in `input_order` (only when
        `unpackable`)."""
        q = self._layout().unpack(self.packed).view(self.out_features, -1, self.group_size)
        scale = self.scales_and_zeros[..., 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[..., 1].t().float().contiguous().unsqueeze(-1)
        return torch.addcmul(zero, q.float() - INT4_MIDPOINT, scale).view(self.out_features, self.in_features)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of the weight (an embedding lookup), unpacking only their blocks (only when `unpackable`)."""
        flat = ids.reshape(-1)
        q = self._layout().rows(self.packed, flat).view(flat.shape[0], -1, self.group_size).float()
        scale = self.scales_and_zeros[:, flat, 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[:, flat, 1].t().float().contiguous().unsqueeze(-1)
        values = torch.addcmul(zero, q - INT4_MIDPOINT, scale)
        return values.view(*ids.shape, self.in_features).to(dtype)

    def _layout(self) -> PackedLayout:
        if self.layout is None:
            raise ValueError("this CPU packs int4 weights in a layout Tandem cannot read back")
        return self.layout


class Int4TritonWeight:
    """An int4 groupwise weight on a CUDA device for Tandem's Triton kernel (`int4_triton`): the values `Int4Weight`
    multiplies by, packed eight to an int32, scales and zeros in bfloat16 or float16 (`dtype`); activations of
    another dtype are cast to it and the output back."""

    def __init__(self, groups: Int4Groups, dtype: torch.dtype = ACTIVATION_DTYPE) -> None:
        from tandem_server.layers import int4_triton  # noqa: PLC0415  (Triton only when a weight is on CUDA)

        self._kernel = int4_triton
        self.out_features, self.in_features = groups.q.shape
        self.group_size = groups.group_size
        self.input_order = groups.input_order
        self.dtype = dtype if dtype in int4_triton.ACTIVATION_DTYPES else ACTIVATION_DTYPE
        self.words = int4_triton.pack(groups.q)
        self.scale = groups.scale.t().to(self.dtype).contiguous()
        self.zero = groups.zero.t().to(self.dtype).contiguous()
        self.nbytes = _nbytes(self.words) + _nbytes(self.scale) + _nbytes(self.zero)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        out = self._kernel.int4_gemm(x.to(self.dtype), self.words, self.scale, self.zero, self.group_size)
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Never called: an embedding on CUDA stays dense (`rows_available` is False for this format)."""
        raise TypeError("invariant: a CUDA int4 weight serves no embedding rows")


class Int8GroupsWeight:
    """An int8 weight with a scale per group of 32 inputs (GGUF's Q8_0), exactly: two int4 weights, its high and
    low nibbles, multiplied and summed (torch's int8 kernel takes one scale per output channel only)."""

    def __init__(self, groups: Int8Groups) -> None:
        high, low = groups.nibble_planes()
        self.high, self.low = Int4Weight(high), Int4Weight(low)
        self.out_features, self.in_features = groups.q.shape
        self.nbytes = self.high.nbytes + self.low.nbytes

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.high.linear(x, None) + self.low.linear(x, None)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (self.high.rows(ids, torch.float32) + self.low.rows(ids, torch.float32)).to(dtype)


# Measured on 2 AVX2 cores (1 thread, a 3072 x 576 weight): the int4 kernel takes 0.73 / 9.1 / 29 / 107 ms at 1 / 32 /
# 128 / 512 rows, float32 dense 1.7 / 10 / 19 / 67 ms, and unpacking the weight 22 ms; unpack-and-dense wins from
# about 256 rows (76 ms at 512).
DENSE_MIN_ROWS = 256


class Int8Weight:
    """An int8 per-channel weight for `torch._weight_int8pack_mm`; also serves embedding lookups of its rows."""

    def __init__(self, channels: Int8Channels) -> None:
        self.out_features, self.in_features = channels.q.shape
        self.q = channels.q.contiguous()
        self.scale = channels.scale.float()
        self.kernel_scale = channels.scale.to(ACTIVATION_DTYPE)
        self.nbytes = _nbytes(self.q) + _nbytes(self.scale) + _nbytes(self.kernel_scale)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x.to(ACTIVATION_DTYPE), self.q, self.kernel_scale).to(x.dtype)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup)."""
        return (F.embedding(ids, self.q).float() * F.embedding(ids, self.scale.unsqueeze(-1))).to(dtype)


class Fp8Recipe(enum.Enum):
    """How a float8 weight's scales meet `torch._scaled_mm`, fixed at load by the weight's device (`fp8_recipe`)."""

    # CPU: one call per run of `input_group` inputs, activations scaled per token and run, the runs summed in float32:
    # exactly the block-wise product, at most the cost of one call over all inputs (measured 0.5 to 1.0 times: runs of
    # 128, 1536 x 576 to 2048 x 2048 weights, 1 and 32 rows).
    RUNS = "runs"
    # CUDA: one call, one scale per weight row and one per token; a block-wise weight is requantized per row at load.
    ROW_WISE = "row-wise"
    # CUDA on Hopper: one call with the weight's 128 x 128 block scales and activations scaled per token and 128 inputs
    # (weights whose scales are not such blocks fall back to ROW_WISE).
    BLOCK_WISE = "block-wise"


def fp8_recipe(device: torch.device) -> Fp8Recipe:
    """The recipe float8 weights on `device` take: block-wise where torch has the block-scaled GEMM (capability 9.x,
    cuBLASLt 12.9 on), row-wise on other CUDA GPUs (8.9, 10.x, 12.x), runs on CPU."""
    if device.type != "cuda":
        return Fp8Recipe.RUNS
    major, _ = torch.cuda.get_device_capability(device)
    cuda = tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])
    return Fp8Recipe.BLOCK_WISE if major == 9 and cuda >= _BLOCK_WISE_MIN_CUDA else Fp8Recipe.ROW_WISE


class Fp8Weight:
    """A float8 e4m3 weight for `torch._scaled_mm`, multiplied as its `Fp8Recipe` says (by default its device's);
    also serves embedding lookups of its rows."""

    def __init__(self, channels: Fp8Channels, recipe: Fp8Recipe | None = None) -> None:
        self.out_features, self.in_features = channels.q.shape
        if channels.q.is_cuda and (self.out_features % _FP8_CUDA_MULTIPLE or self.in_features % _FP8_CUDA_MULTIPLE):
            raise ValueError(
                f"fp8 on CUDA needs features in multiples of {_FP8_CUDA_MULTIPLE}, this weight is "
                f"{self.out_features} x {self.in_features}"
            )
        self.recipe = recipe or fp8_recipe(channels.q.device)
        blocks = None
        if self.recipe is Fp8Recipe.BLOCK_WISE and channels.input_scale is None:
            blocks = gemm_block_scales(channels)
        if blocks is None and self.recipe is not Fp8Recipe.RUNS:
            self.recipe = Fp8Recipe.ROW_WISE
            channels = channels if channels.input_group is None else requantize_rows(channels)
        self.run_width = channels.input_group or self.in_features
        self.q = channels.q.contiguous()
        if blocks is not None:
            # [in / 128, ceil(out / 128)], strides (1, in / 128): block scales transposed, as `_scaled_mm` reads them.
            self.scale = blocks.t()
        else:
            # [runs, 1, out]: each run's weight scales as `_scaled_mm` takes them (a single run when not grouped).
            self.scale = channels.scale.float().reshape(self.out_features, -1).t().unsqueeze(1).contiguous()
        self.input_scale = channels.input_scale
        self.activation_bound = channels.activation_bound
        # CUDA's row-wise scaled GEMM writes bfloat16 or float16 only; on CPU float32.
        self.out_dtype = torch.float32 if self.recipe is Fp8Recipe.RUNS else torch.bfloat16
        self.nbytes = _nbytes(self.q) + _nbytes(self.scale)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.recipe is Fp8Recipe.BLOCK_WISE:
            q, scale = self.quantize_activations(x, GEMM_BLOCK)
            out = torch._scaled_mm(q, self.q.t(), scale_a=scale, scale_b=self.scale, out_dtype=self.out_dtype)
        else:
            out = self._run_product(x, 0)
            # Only a CPU weight has several runs; their products sum in float32.
            for run in range(1, self.scale.shape[0]):
                out.add_(self._run_product(x, run))
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def _run_product(self, x: torch.Tensor, run: int) -> torch.Tensor:
        """The product of run `run` of input features alone, its activations scaled per token within the run."""
        features = slice(run * self.run_width, (run + 1) * self.run_width)
        q, scale = self.quantize_activations(x[:, features])
        weight = self.q[:, features].t()
        return torch._scaled_mm(q, weight, scale_a=scale, scale_b=self.scale[run], out_dtype=self.out_dtype)

    def quantize_activations(self, x: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` as float8 values and float32 scales such that `x ~= values * scales`: one scale per token (`[rows, 1]`),
        or per token and `group` inputs (`[rows, in / group]`, outer-dim-major as the block-scaled GEMM reads them)."""
        values = x.float() if group is None else x.float().unflatten(-1, (-1, group))
        if self.input_scale is not None:
            scale = values.new_full((*values.shape[:-1], 1), self.input_scale)
        else:
            largest = values.abs().amax(-1, keepdim=True)
            if self.activation_bound is not None:
                largest = largest.clamp_max(self.activation_bound)
            scale = (largest / FP8_MAX).clamp_min(_FP8_MIN_SCALE)
        q = (values / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(x.shape).contiguous()
        if group is None:
            return q, scale
        return q, scale.squeeze(-1).t().contiguous().t()

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup)."""
        if self.recipe is Fp8Recipe.BLOCK_WISE:
            scales = self.scale.t()[ids // GEMM_BLOCK].repeat_interleave(GEMM_BLOCK, dim=-1)
        else:
            scales = self.scale[:, 0, ids].movedim(0, -1).repeat_interleave(self.run_width, dim=-1)
        return (self.q[ids].float() * scales[..., : self.in_features]).to(dtype)


# CUDA's float8 GEMMs take matrices whose dimensions are multiples of 16.
_FP8_CUDA_MULTIPLE = 16
# The block-scaled GEMM is cuBLASLt's, from CUDA 12.9 on.
_BLOCK_WISE_MIN_CUDA = (12, 9)
# An all-zero activation row still gets a positive scale (FBGEMM's floor: 1 / (448 * 512)).
_FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
# torch._scaled_mm's float8 GEMMs on CUDA (Ada and Hopper onwards).
FP8_MIN_CAPABILITY = (8, 9)
# The int4 Triton kernel's bfloat16 dots (Ampere onwards); it is compiled and checked for sm80 and sm90.
INT4_CUDA_MIN_CAPABILITY = (8, 0)

QuantizedWeight = Int4Weight | Int4TritonWeight | Int8Weight | Int8GroupsWeight | Fp8Weight


def quantized_weight(
    source: Int4Groups | Int8Groups | Int8Channels, dtype: torch.dtype = ACTIVATION_DTYPE
) -> QuantizedWeight:
    """The kernel-ready form of unpacked quantized values where they live (int4 on CUDA: Tandem's Triton kernel, its
    scales in the model's `dtype`); int8 groups need the known int4 layout, else they are rounded to int8 channels."""
    if isinstance(source, Int4Groups):
        return Int4TritonWeight(source, dtype) if source.q.is_cuda else Int4Weight(source)
    if isinstance(source, Int8Groups):
        if source.q.shape[0] % INT4_OUT_MULTIPLE == 0 and packed_block() is not None:
            return Int8GroupsWeight(source)
        return Int8Weight(quantize_int8(source.dequantize()))
    return Int8Weight(source)


def rows_available(weight: QuantizedWeight) -> bool:
    """Whether `weight.rows` can serve embedding lookups (never on CUDA: the embedding there stays dense)."""
    if isinstance(weight, Int4TritonWeight):
        return False
    if isinstance(weight, Int4Weight):
        return weight.unpackable and weight.input_order is None
    return isinstance(weight, (Int8Weight, Fp8Weight)) or weight.high.unpackable


def dense_values(weight: QuantizedWeight) -> torch.Tensor | None:
    """The float32 `[out, in]` values a CPU weight multiplies by, input features in the checkpoint's order; None for
    a weight that cannot unpack (float8, CUDA, an unknown int4 layout)."""
    if isinstance(weight, Int8Weight):
        return weight.q.float() * weight.scale.unsqueeze(-1)
    if isinstance(weight, Int8GroupsWeight):
        if not weight.high.unpackable:
            return None
        return weight.high.dequantize() + weight.low.dequantize()
    if not isinstance(weight, Int4Weight) or not weight.unpackable:
        return None
    values = weight.dequantize()
    if weight.input_order is None:
        return values
    # Column j multiplies input feature input_order[j].
    ordered = torch.empty_like(values)
    ordered[:, weight.input_order] = values
    return ordered


def format_name(weight: QuantizedWeight) -> str:
    names = {Int4Weight: "int4", Int4TritonWeight: "int4", Int8Weight: "int8", Fp8Weight: "fp8"}
    names[Int8GroupsWeight] = "int8 in groups of 32"
    return names[type(weight)]


def kernels_unavailable_reason(device: torch.device, mode: QuantizeMode) -> str | None:
    """None when this device and torch build have the kernels `mode` needs, else why not."""
    if mode is QuantizeMode.FP8:
        return _fp8_unavailable_reason(device)
    if mode is QuantizeMode.INT4 and device.type == "cuda":
        return _int4_cuda_unavailable_reason(device)
    if device.type != "cpu":
        return (
            f"{mode.value} GEMMs are a CPU path (on CUDA, int4 runs through Tandem's Triton kernel; int8 and GGUF's "
            "int8 groups have no CUDA kernel)"
        )
    if not hasattr(torch, "_convert_weight_to_int4pack_for_cpu") or not hasattr(torch, "_weight_int8pack_mm"):
        return "this torch build has no CPU weight-only int4/int8 kernels"
    return None


def _int4_cuda_unavailable_reason(device: torch.device) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "int4 GEMMs on CUDA run through Tandem's Triton kernel, and Triton is not installed"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < INT4_CUDA_MIN_CAPABILITY:
        return (
            f"the int4 Triton kernel needs a GPU of compute capability "
            f"{'.'.join(map(str, INT4_CUDA_MIN_CAPABILITY))} or newer (bfloat16 dots: Ampere onwards); "
            f"{torch.cuda.get_device_name(device)} is {major}.{minor}"
        )
    return None


def _fp8_unavailable_reason(device: torch.device) -> str | None:
    if not hasattr(torch, "_scaled_mm"):
        return "this torch build has no float8 GEMM (torch._scaled_mm)"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < FP8_MIN_CAPABILITY:
            return (
                f"float8 GEMMs need a GPU of compute capability {'.'.join(map(str, FP8_MIN_CAPABILITY))} or newer "
                f"(Ada, Hopper, Blackwell); {torch.cuda.get_device_name(device)} is {major}.{minor}"
            )
    elif device.type != "cpu":
        return f"float8 GEMMs run on CPU or CUDA, not {device.type}"
    return None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
