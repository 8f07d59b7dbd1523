"""Human-readable output: a block per run, a summary table, and ratios against the baseline server."""

from __future__ import annotations

from tandem_bench.metrics import Stats, Summary
from tandem_bench.runner import RunRecord

WIDTH = 60


def _line(label: str, value: str) -> str:
    return f"{label:<44}{value:>16}"


def _stats_lines(name: str, stats: Stats) -> list[str]:
    return [
        f"{'-' * 20}{name:^20}{'-' * 20}",
        _line(f"Mean {name} (ms):", f"{stats.mean:.2f}"),
        _line(f"Median {name} (ms):", f"{stats.median:.2f}"),
        _line(f"P90 {name} (ms):", f"{stats.p90:.2f}"),
        _line(f"P99 {name} (ms):", f"{stats.p99:.2f}"),
    ]


def format_run(record: RunRecord) -> str:
    """The figures of one run, laid out like `vllm bench serve`."""
    summary = record.summary
    lines = [
        f"{' ' + record.server + ' · ' + record.point.label + ' ':=^{WIDTH}}",
        _line("Successful requests:", str(summary.completed)),
        _line("Failed requests:", str(summary.failed)),
        _line("Benchmark duration (s):", f"{summary.duration_s:.2f}"),
        _line("Total input tokens:", str(summary.input_tokens)),
        _line("Total generated tokens:", str(summary.output_tokens)),
        _line("Request throughput (req/s):", f"{summary.request_throughput:.2f}"),
        _line("Output token throughput (tok/s):", f"{summary.output_throughput:.2f}"),
        _line("Total token throughput (tok/s):", f"{summary.total_token_throughput:.2f}"),
        *_stats_lines("TTFT", summary.ttft),
        *_stats_lines("TPOT", summary.tpot),
        *_stats_lines("ITL", summary.itl),
        *_stats_lines("E2E", summary.e2e),
    ]
    lines += [f"error: {error}" for error in summary.errors]
    lines.append("=" * WIDTH)
    return "\n".join(lines)


TABLE_HEADER = (
    "| server | load | ok/failed | req/s | output tok/s | total tok/s | TTFT median / p99 (ms) "
    "| TPOT median (ms) | ITL median / p99 (ms) | E2E median (ms) |"
)


def table_row(record: RunRecord) -> str:
    """One markdown row with the headline figures of a run."""
    s = record.summary
    return (
        f"| {record.server} | {record.point.label} | {s.completed}/{s.failed} | {s.request_throughput:.2f} "
        f"| {s.output_throughput:.1f} | {s.total_token_throughput:.1f} | {s.ttft.median:.0f} / {s.ttft.p99:.0f} "
        f"| {s.tpot.median:.1f} | {s.itl.median:.1f} / {s.itl.p99:.1f} | {s.e2e.median:.0f} |"
    )


def format_table(records: list[RunRecord]) -> str:
    """A markdown table, one row per run."""
    separator = "|" + "|".join("---" for _ in range(TABLE_HEADER.count("|") - 1)) + "|"
    return "\n".join([TABLE_HEADER, separator, *(table_row(record) for record in records)])


RATIO_FIELDS: tuple[tuple[str, str], ...] = (
    ("output tok/s", "output_throughput"),
    ("req/s", "request_throughput"),
    ("TTFT median", "ttft.median"),
    ("TPOT median", "tpot.median"),
    ("ITL median", "itl.median"),
    ("E2E median", "e2e.median"),
)


def _field(summary: Summary, path: str) -> float:
    value: object = summary
    for part in path.split("."):
        value = getattr(value, part)
    return float(value)  # type: ignore[arg-type]


def ratio(value: float, baseline: float) -> str:
    """`value / baseline` as text; a zero baseline has no ratio."""
    return f"{value / baseline:.2f}x" if baseline else "n/a"


def format_ratios(records: list[RunRecord], baseline_server: str) -> str:
    """For each load point, every other server's figures divided by the baseline's from the same invocation."""
    header = "| server | load | " + " | ".join(name for name, _ in RATIO_FIELDS) + " |"
    lines = [header, "|" + "|".join("---" for _ in range(len(RATIO_FIELDS) + 2)) + "|"]
    baselines = {record.point: record.summary for record in records if record.server == baseline_server}
    for record in records:
        baseline = baselines.get(record.point)
        if record.server == baseline_server or baseline is None:
            continue
        cells = [ratio(_field(record.summary, path), _field(baseline, path)) for _, path in RATIO_FIELDS]
        lines.append(f"| {record.server} / {baseline_server} | {record.point.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
