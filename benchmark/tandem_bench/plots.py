"""PNG plots: throughput against load, and TTFT / ITL percentile curves per server and load point."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from tandem_bench.runner import RunRecord

CURVE_PERCENTILES = np.linspace(0, 100, 101)


def _load_value(record: RunRecord) -> float:
    point = record.point
    return float(point.request_rate if point.request_rate is not None else point.concurrency or 1)


def plot_throughput(records: list[RunRecord], path: Path) -> None:
    """Output-token throughput against concurrency (closed loop) or request rate (open loop), one line per server."""
    modes = [
        mode
        for mode in ("closed", "open")
        if any((r.point.request_rate is None) == (mode == "closed") for r in records)
    ]
    figure, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4), squeeze=False)
    for mode, ax in zip(modes, axes[0], strict=True):
        subset = [r for r in records if (r.point.request_rate is None) == (mode == "closed")]
        for server in dict.fromkeys(r.server for r in subset):
            runs = sorted((r for r in subset if r.server == server), key=_load_value)
            ax.plot([_load_value(r) for r in runs], [r.summary.output_throughput for r in runs], "o-", label=server)
        if mode == "closed":
            ticks = sorted({_load_value(r) for r in subset})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
            ax.minorticks_off()
        ax.set_xlabel("concurrency" if mode == "closed" else "request rate (req/s)")
        ax.set_ylabel("output tokens/s")
        ax.set_title("closed loop" if mode == "closed" else "open loop")
        ax.grid(alpha=0.3)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_latency_percentiles(records: list[RunRecord], path: Path) -> None:
    """TTFT and pooled-ITL percentile curves (latency at each percentile), one line per server and load point."""
    figure, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for record in records:
        ok = [r for r in record.requests if r.success]
        label = f"{record.server} {record.point.label}"
        ttfts = [r.ttft * 1000 for r in ok]
        gaps = [gap * 1000 for r in ok for gap in r.itl]
        if ttfts:
            ttft_ax.plot(CURVE_PERCENTILES, np.percentile(ttfts, CURVE_PERCENTILES), label=label)
        if gaps:
            itl_ax.plot(CURVE_PERCENTILES, np.percentile(gaps, CURVE_PERCENTILES), label=label)
    for ax, name in ((ttft_ax, "TTFT"), (itl_ax, "ITL")):
        ax.set_xlabel("percentile")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_yscale("log")
        ax.set_title(f"{name} percentiles")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(records: list[RunRecord], directory: Path) -> list[Path]:
    """Writes both plots into `directory` and returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    throughput = directory / "throughput.png"
    latency = directory / "latency_percentiles.png"
    plot_throughput(records, throughput)
    plot_latency_percentiles(records, latency)
    return [throughput, latency]
