"""The GPU check's FP8 numerics: each Llama-3-8B GEMM through the shard's float8 path against bfloat16.

Weights are drawn like the random checkpoint's (N(0, 0.02)) and rounded to float8 e4m3 per output channel; the
activations are scaled per token into float8, as `--quantize fp8` serves them. e4m3 keeps 4 significant bits, so
each weight and activation moves by up to 2^-4 of itself (about 2.7% RMS each); the two errors add in quadrature.
"""

from __future__ import annotations

from typing import Any

# [out, in] of each GEMM of Llama-3-8B (q/k/v and gate/up stacked, as the shard runs them).
LLAMA3_8B_GEMMS: dict[str, tuple[int, int]] = {
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (28672, 4096),
    "down_proj": (4096, 14336),
    "lm_head": (128256, 4096),
}
# Relative RMS error of a float8 GEMM's output against bfloat16 (measured on CPU: 0.0375 to 0.0379 for qkv_proj,
# o_proj and down_proj at 4 rows).
FP8_RELATIVE_RMS_BOUND = 0.05
WEIGHT_STD = 0.02


def fp8_gemm_errors(
    shapes: dict[str, tuple[int, int]], rows: int, device: str, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per GEMM: the float8 output's relative RMS error against the bfloat16 GEMM on the same inputs."""
    import torch  # noqa: PLC0415  (torch is only needed where the check runs)
    import torch.nn.functional as F  # noqa: PLC0415
    from tandem_server.quant.fp8.weight import Fp8Weight  # noqa: PLC0415
    from tandem_server.quant.values import quantize_fp8  # noqa: PLC0415

    generator = torch.Generator(device=device).manual_seed(seed)
    errors = {}
    for role, (out_features, in_features) in shapes.items():
        weight = torch.empty(out_features, in_features, device=device, dtype=torch.bfloat16)
        weight.normal_(0.0, WEIGHT_STD, generator=generator)
        x = torch.randn(rows, in_features, device=device, dtype=torch.bfloat16, generator=generator)
        expected = F.linear(x, weight).float()
        actual = Fp8Weight(quantize_fp8(weight)).linear(x, None).float()
        error = ((actual - expected).norm() / expected.norm()).item()
        errors[role] = {"relative_rms": error, "ok": error <= FP8_RELATIVE_RMS_BOUND}
        del weight, x, expected, actual
    return errors


def fp8_against_bf16(phases: dict[str, dict[str, Any]], bf16_run: str, fp8_run: str) -> dict[str, float]:
    """FP8's batch-1 time per output token and batch-256 output throughput beside the bfloat16 run's (same backend),
    from the sweep rows the check recorded; a batch size either run lacks is left out."""
    rows = {
        run: {row["concurrency"]: row for row in phases.get(f"throughput/{run}", {}).get("rows", [])}
        for run in (bf16_run, fp8_run)
    }
    bf16, fp8 = rows[bf16_run], rows[fp8_run]
    compared: dict[str, float] = {}
    if 1 in bf16 and 1 in fp8:
        compared |= {"bf16_tpot_ms_batch_1": bf16[1]["tpot_p50_ms"], "fp8_tpot_ms_batch_1": fp8[1]["tpot_p50_ms"]}
    if 256 in bf16 and 256 in fp8:
        compared |= {
            "bf16_tokens_per_s_batch_256": bf16[256]["output_throughput"],
            "fp8_tokens_per_s_batch_256": fp8[256]["output_throughput"],
        }
    return compared
