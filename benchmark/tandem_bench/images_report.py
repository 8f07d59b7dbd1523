"""What `tandem-bench images` reports: each mode's time to first token and throughput, and pooled over fresh."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tandem_bench.client import RequestResult
from tandem_bench.images import FRESH, POOLED
from tandem_bench.metrics import Summary, summarize

RATIO_FIGURES = ("ttft_p50", "ttft_p90", "ttft_p99", "request_throughput", "output_throughput")


@dataclass
class ModeRun:
    """Every request one mode sent, over all rounds, and the wall time its rounds took together."""

    mode: str
    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0

    def add_round(self, results: list[RequestResult], duration_s: float) -> None:
        self.results.extend(results)
        self.duration_s += duration_s

    def summary(self) -> Summary:
        return summarize(self.results, self.duration_s)

    def mean_cached_tokens(self) -> float | None:
        """Mean prompt tokens the server served from its prefix cache, over the successful requests that said."""
        reported = [r.cached_tokens for r in self.results if r.success and r.cached_tokens is not None]
        return sum(reported) / len(reported) if reported else None

    def mean_prompt_tokens(self) -> float | None:
        reported = [r.prompt_tokens for r in self.results if r.success and r.prompt_tokens is not None]
        return sum(reported) / len(reported) if reported else None


def _figures(summary: Summary) -> dict[str, float]:
    return {
        "ttft_p50": summary.ttft.median,
        "ttft_p90": summary.ttft.p90,
        "ttft_p99": summary.ttft.p99,
        "request_throughput": summary.request_throughput,
        "output_throughput": summary.output_throughput,
    }


def pooled_over_fresh(fresh: Summary, pooled: Summary) -> dict[str, float | None]:
    """Each figure of the pooled mode divided by the fresh mode's (None where the fresh figure is 0)."""
    over, under = _figures(pooled), _figures(fresh)
    return {name: over[name] / under[name] if under[name] else None for name in RATIO_FIGURES}


@dataclass(frozen=True)
class ImagesReport:
    """Both modes of one invocation against one server."""

    fresh: ModeRun
    pooled: ModeRun

    def ratios(self) -> dict[str, float | None]:
        return pooled_over_fresh(self.fresh.summary(), self.pooled.summary())

    @property
    def failed(self) -> int:
        return self.fresh.summary().failed + self.pooled.summary().failed

    def to_dict(self) -> dict[str, Any]:
        modes = {}
        for run in (self.fresh, self.pooled):
            modes[run.mode] = {
                "summary": run.summary().to_dict(),
                "mean_prompt_tokens": run.mean_prompt_tokens(),
                "mean_cached_tokens": run.mean_cached_tokens(),
                "requests": [asdict(result) for result in run.results],
            }
        return {"modes": modes, "pooled_over_fresh": self.ratios()}


def _tokens_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def format_report(report: ImagesReport) -> str:
    """A Markdown table of both modes (latencies in milliseconds) and the pooled / fresh ratios under it."""
    lines = [
        "| mode | ok/failed | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | req/s | output tok/s "
        "| prompt tokens (mean) | cached prompt tokens (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {FRESH: "fresh image every request", POOLED: "images repeated from a pool"}
    for run in (report.fresh, report.pooled):
        summary = run.summary()
        lines.append(
            f"| {labels[run.mode]} | {summary.completed}/{summary.failed} | {summary.ttft.median:.1f} "
            f"| {summary.ttft.p90:.1f} | {summary.ttft.p99:.1f} | {summary.e2e.median:.1f} "
            f"| {summary.request_throughput:.2f} | {summary.output_throughput:.1f} "
            f"| {_tokens_cell(run.mean_prompt_tokens())} | {_tokens_cell(run.mean_cached_tokens())} |"
        )
    ratios = report.ratios()
    lines.append(
        f"\npooled / fresh (same invocation): TTFT p50 {_ratio_cell(ratios['ttft_p50'])}, "
        f"p90 {_ratio_cell(ratios['ttft_p90'])}, p99 {_ratio_cell(ratios['ttft_p99'])}; "
        f"requests/s {_ratio_cell(ratios['request_throughput'])}"
    )
    for run in (report.fresh, report.pooled):
        for error in run.summary().errors:
            lines.append(f"{run.mode} error: {error}")
    return "\n".join(lines)
