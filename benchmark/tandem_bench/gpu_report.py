"""The GPU check's throughput table: per batch size, throughput, TTFT/ITL percentiles and MFU of both phases."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tandem_bench.metrics import Summary
from tandem_bench.mfu import TransformerShape, utilisation


@dataclass(frozen=True)
class SweepRow:
    """One closed-loop batch size of the sweep."""

    concurrency: int
    completed: int
    failed: int
    mean_prompt_tokens: float
    output_throughput: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    tpot_p50_ms: float
    # Steady decode: `concurrency` requests each advance one token per median time per output token (TPOT; the
    # inter-token gaps are not used because a stream may deliver several tokens in one chunk).
    decode_mfu: float
    # Mean forward pass per step, and mean idle time of the model between two forward passes (shard-timed).
    forward_ms: float = 0.0
    forward_gap_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_row(concurrency: int, summary: Summary, shape: TransformerShape, output_len: int, peak: float) -> SweepRow:
    """A row from a run's summary; decode MFU counts each token at the mean context of a generation."""
    prompt = summary.input_tokens / summary.completed if summary.completed else 0.0
    mean_context = int(prompt + output_len / 2)
    tpot_seconds = summary.tpot.median / 1000.0
    decode_flops_per_second = concurrency * shape.token_flops(mean_context) / tpot_seconds if tpot_seconds else 0.0
    return SweepRow(
        concurrency=concurrency,
        completed=summary.completed,
        failed=summary.failed,
        mean_prompt_tokens=prompt,
        output_throughput=summary.output_throughput,
        ttft_p50_ms=summary.ttft.median,
        ttft_p90_ms=summary.ttft.p90,
        ttft_p99_ms=summary.ttft.p99,
        itl_p50_ms=summary.itl.median,
        itl_p90_ms=summary.itl.p90,
        itl_p99_ms=summary.itl.p99,
        tpot_p50_ms=summary.tpot.median,
        decode_mfu=decode_flops_per_second / peak,
    )


def prefill_mfu(shape: TransformerShape, prompt_lengths: list[int], forward_seconds: float, peak: float) -> float:
    """MFU of prefill-only steps that processed exactly these prompts in `forward_seconds` of forward passes."""
    return utilisation(sum(shape.prefill_flops(length) for length in prompt_lengths), forward_seconds, peak)


def format_sweep(rows: list[SweepRow]) -> str:
    """A fixed-width table, one line per batch size."""
    header = (
        f"{'batch':>5} {'done':>5} {'prompt':>6} {'out tok/s':>10} {'TTFT p50/p90/p99 ms':>22} "
        f"{'ITL p50/p90/p99 ms':>20} {'TPOT ms':>8} {'decode MFU':>10} {'fwd ms':>7} {'gap ms':>7}"
    )
    lines = [header]
    for row in rows:
        ttft = f"{row.ttft_p50_ms:.0f}/{row.ttft_p90_ms:.0f}/{row.ttft_p99_ms:.0f}"
        itl = f"{row.itl_p50_ms:.1f}/{row.itl_p90_ms:.1f}/{row.itl_p99_ms:.1f}"
        lines.append(
            f"{row.concurrency:>5} {row.completed:>5} {row.mean_prompt_tokens:>6.0f} {row.output_throughput:>10.1f} "
            f"{ttft:>22} {itl:>20} {row.tpot_p50_ms:>8.1f} {row.decode_mfu:>10.1%} "
            f"{row.forward_ms:>7.2f} {row.forward_gap_ms:>7.2f}"
        )
    return "\n".join(lines)
