"""The README block of `make bench`: one row per (workload, server), ratios against Tandem, roofline and MFU."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from tandem_bench.mfu import TransformerShape, utilisation
from tandem_bench.peers import StaticBatchResult
from tandem_bench.roofline import Roofline
from tandem_bench.runner import RunRecord

HEADER = (
    "| workload | server | ok/failed | output tok/s | vs Tandem | TTFT median / p99 | ITL median / p99 "
    "| TPOT median | E2E median | MFU |"
)


@dataclass(frozen=True)
class MeasuredRow:
    """One server's run of one workload; `baseline` is Tandem's run of the same workload."""

    workload: str
    record: RunRecord
    baseline: RunRecord
    # The precision the server multiplies in ("float32", "bfloat16"), None when no roofline figure fits (quantized).
    precision: str | None = "float32"


def run_flops(record: RunRecord, shape: TransformerShape) -> float:
    """Model FLOPs of every successful request, its whole prompt counted as computed (cached prefixes included)."""
    total = 0.0
    for request in record.requests:
        if request.success:
            prompt = request.prompt_tokens or request.prompt_words
            total += shape.prefill_flops(prompt) + shape.decode_flops(prompt, request.output_tokens)
    return total


def _row(row: MeasuredRow, shape: TransformerShape, roofline: Roofline) -> str:
    s, base = row.record.summary, row.baseline.summary
    versus = s.output_throughput / base.output_throughput if base.output_throughput else 0.0
    mfu = "-"
    if row.precision is not None:
        mfu = f"{utilisation(run_flops(row.record, shape), s.duration_s, roofline.peak_for(row.precision)):.1%}"
    return (
        f"| {row.workload} | {row.record.server} | {s.completed}/{s.failed} | {s.output_throughput:.1f} "
        f"| {versus:.2f}x | {s.ttft.median:.0f} / {s.ttft.p99:.0f} | {s.itl.median:.1f} / {s.itl.p99:.1f} "
        f"| {s.tpot.median:.1f} | {s.e2e.median:.0f} | {mfu} |"
    )


def _static_row(
    workload: str, result: StaticBatchResult, baseline: RunRecord, shape: TransformerShape, peak: float
) -> str:
    flops = result.batch * (
        shape.prefill_flops(result.input_len) + shape.decode_flops(result.input_len, result.output_len)
    )
    versus = result.output_throughput / baseline.summary.output_throughput
    runs = f" (mean of {result.runs} runs, before and after)" if result.runs > 1 else ""
    return (
        f"| {workload} | transformers static batch of {result.batch}, {result.dtype}{runs} | {result.batch}/0 "
        f"| {result.output_throughput:.1f} | {versus:.2f}x | - | - | {result.decode_step_ms:.1f} (decode step) "
        f"| {1000 * result.seconds:.0f} | {utilisation(flops, result.seconds, peak):.1%} |"
    )


def readme_block(
    intro: str,
    rows: list[MeasuredRow],
    static: list[tuple[str, StaticBatchResult]],
    roofline: Roofline,
    shape: TransformerShape,
    commands: list[str],
) -> str:
    """The intro paragraph, the roofline, the table and the command behind each workload."""
    roof = (
        f"Roofline measured in the same run ({roofline.threads} torch threads): float32 matmul "
        f"{roofline.square_flops / 1e9:.0f} GFLOP/s at 2048³ and {roofline.model_flops / 1e9:.0f} GFLOP/s on the "
        f"model's decode matmuls at batch {roofline.batch}; bfloat16 matmul {roofline.bf16_square_flops / 1e9:.0f} "
        f"GFLOP/s at 2048³; copy bandwidth {roofline.copy_bytes_per_s / 1e9:.1f} GB/s. MFU divides each run's model "
        f"FLOPs ({2 * shape.matmul_params / 1e9:.2f} GFLOP per token plus attention) by its duration and the peak of "
        "the precision the server computes in (float32: the larger float32 figure); quantized kernels (llama-server's, "
        "Tandem's with `--quantize`) have no figure here. Cached prompt tokens count as computed, so the shared-prefix "
        "rows read as effective utilisation and can pass 100%."
    )
    # Flags stay whole: a line never breaks inside `--torch-compile` or `--kv-cache-memory`.
    wrap = textwrap.TextWrapper(width=120, break_on_hyphens=False, break_long_words=False)
    lines = [*wrap.wrap(intro), "", *wrap.wrap(roof), "", HEADER]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        lines.append(_row(row, shape, roofline))
        if row.record is row.baseline:
            lines += [
                _static_row(row.workload, result, row.baseline, shape, roofline.peak_for(result.dtype))
                for workload, result in static
                if workload == row.workload
            ]
    lines += ["", "Each workload against a running server (add `--compare name=URL ...` for several):", "", "```sh"]
    lines += [*commands, "```"]
    return "\n".join(lines)
