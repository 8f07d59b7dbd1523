"""Prepares a loaded model's weights before it serves: named steps, run once each, in the order `STEPS` lists.

Each step gives some linear layers a new `WeightFormat` and logs what it did. The order is a dependency:
- quantize decides every layer's format from `--quantize` and the checkpoint, and releases the float weights it
  replaced; the others read what it decided;
- dense copies unpack the quantized formats' values into bfloat16 copies for batches, so they follow quantize;
- pack prepacks the float weights of the layers still dense, so it follows both (a quantized layer has no float
  weight to pack).
`torch.compile` is not a step: the compiled stages take whatever formats the layers hold, so it runs after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tandem_server.quant import dense_copies
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.packed import pack_gemm_weights, packing_available, packing_summary
from tandem_server.quant.quantize import QuantizationReport, quantize_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightPreparation:
    """What the steps are asked for: the shard's weight flags and where the model runs."""

    quantize: QuantizeMode
    # `--quantized-dense-memory`: bytes for bfloat16 copies; None for `auto`, 0 for none.
    dense_copy_memory: int | None
    # Ranks sharing this node's memory (`auto` splits it between them).
    ranks_on_node: int
    # `--packed-gemm-rows`: the row counts dense weights are packed for; empty for none.
    packed_gemm_rows: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype


Step = Callable[[nn.Module, WeightPreparation, QuantizationReport], None]


@dataclass(frozen=True)
class PreparationStep:
    name: str
    run: Step


def prepare_weights(model: nn.Module, preparation: WeightPreparation) -> QuantizationReport:
    """Runs every step of `STEPS` on `model`, in order; returns each weight's format and the bytes they take."""
    report = QuantizationReport()
    for step in STEPS:
        step.run(model, preparation, report)
    return report


def quantize(model: nn.Module, preparation: WeightPreparation, report: QuantizationReport) -> None:
    """Turns the GEMM weights into int4/int8/fp8 as `--quantize` (and an FP8 or int4 checkpoint) asks and logs each
    weight's format and the bytes they take."""
    started = time.perf_counter()
    quantized = quantize_model(model, preparation.quantize)
    report.formats.update(quantized.formats)
    report.weight_bytes += quantized.weight_bytes
    logger.info("%s (%.1fs)", report.describe(), time.perf_counter() - started)


def copy_quantized_weights(model: nn.Module, preparation: WeightPreparation, report: QuantizationReport) -> None:
    """Gives the quantized GEMMs bfloat16 copies for batches within `--quantized-dense-memory` and adds them to
    `report`."""
    memory = preparation.dense_copy_memory
    if memory == 0 or not dense_copies.has_quantized_gemms(model):
        return
    unavailable = dense_copies.unavailable_reason(auto=memory is None)
    if unavailable is not None:
        logger.info("quantized weights get no bfloat16 copies for batches: %s", unavailable)
        return
    started = time.perf_counter()
    budget = dense_copies.auto_budget(preparation.ranks_on_node) if memory is None else memory
    copies = dense_copies.add_dense_copies(model, budget)
    report.formats[f"dense copies: bfloat16 for batches of {dense_copies.DENSE_COPY_MIN_ROWS}+ rows"] += copies.made
    report.weight_bytes += copies.nbytes
    logger.info("%s in %.1fs", copies.describe(), time.perf_counter() - started)


def pack(model: nn.Module, preparation: WeightPreparation, report: QuantizationReport) -> None:
    """Gives the dense GEMMs prepacked weights for `--packed-gemm-rows` where the device and dtype can use them."""
    row_counts = preparation.packed_gemm_rows
    if not row_counts:
        return
    unavailable = packing_available(preparation.device, preparation.dtype)
    if unavailable is not None:
        logger.info("GEMM weights stay unpacked: %s", unavailable)
        return
    started = time.perf_counter()
    added = pack_gemm_weights(model, row_counts)
    logger.info(
        "packed GEMM weights in %.1fs: %s (%.0f MiB)",
        time.perf_counter() - started,
        packing_summary(preparation.dtype, row_counts),
        added / 2**20,
    )


STEPS = (
    PreparationStep("quantize", quantize),
    PreparationStep("dense copies", copy_quantized_weights),
    PreparationStep("pack", pack),
)
