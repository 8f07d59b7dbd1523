"""float8 e4m3 weights with float8 activations through `torch._scaled_mm` (CPU, and CUDA from compute capability 8.9).

`w = q * scale` per output channel (or per output channel and run of input features), float32 scales; activations
scaled per token (per token and run; or by a checkpoint's static scale) into float8, the product accumulated in
float32. On CUDA one `_scaled_mm` per linear, its scales laid out once at load (`Fp8Recipe`).
"""

from __future__ import annotations

import enum

import torch

from tandem_server.quant.fp8.blocks import GEMM_BLOCK, gemm_block_scales, requantize_rows
from tandem_server.quant.values import FP8_DTYPE, FP8_MAX, Fp8Channels, tensor_bytes


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

    name = "fp8"
    serves_rows = True

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
        self.nbytes = tensor_bytes(self.q) + tensor_bytes(self.scale)

    @property
    def quantized(self) -> Fp8Weight:
        return self

    def dense_values(self) -> None:
        """None: float8 weights get no bfloat16 copy (the float8 GEMM already runs on matrix instructions)."""
        return None

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


def unavailable_reason(device: torch.device) -> str | None:
    """None when this device and torch build have float8 GEMMs, else why not."""
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
