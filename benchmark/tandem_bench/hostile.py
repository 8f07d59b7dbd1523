"""The pure parts of `tandem-bench hostile`: what one hostile-load measurement found and how it is printed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class TokenizeFlood:
    """Router RSS before and at the peak of a flood of large `/tokenize` requests, and how they were answered."""

    requests: int
    input_bytes: int
    idle_rss: int
    peak_rss: int
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def peak_ratio(self) -> float:
        return self.peak_rss / self.idle_rss if self.idle_rss else 0.0


@dataclass(frozen=True)
class StreamBeside:
    """One greedy stream measured alone and beside a hostile load (seconds); `hostile` names the load."""

    hostile: str
    alone_e2e: float
    beside_e2e: float
    alone_itl: list[float]
    beside_itl: list[float]
    same_text: bool
    hostile_statuses: dict[int, int] = field(default_factory=dict)

    @property
    def e2e_ratio(self) -> float:
        return self.beside_e2e / self.alone_e2e if self.alone_e2e else 0.0

    @property
    def itl_ratio(self) -> float:
        if not self.alone_itl or not self.beside_itl:
            return 0.0
        return median(self.beside_itl) / median(self.alone_itl)


@dataclass
class HostileReport:
    """Every measurement of one run; the JSON results hold them all."""

    tokenize: TokenizeFlood | None = None
    beside: list[StreamBeside] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokenize": asdict(self.tokenize) if self.tokenize else None,
            "beside": [asdict(run) for run in self.beside],
        }


def _statuses(counts: dict[int, int]) -> str:
    return ", ".join(f"{status}: {count}" for status, count in sorted(counts.items())) or "none"


def format_report(report: HostileReport) -> str:
    """A Markdown table of ratios against the baseline measured in the same run."""
    lines = [
        "| measurement | baseline | under load | ratio | answers to the hostile requests |",
        "|---|---|---|---|---|",
    ]
    flood = report.tokenize
    if flood is not None:
        lines.append(
            f"| router RSS, {flood.requests} concurrent /tokenize of {flood.input_bytes / MIB:.1f} MiB "
            f"| {flood.idle_rss / MIB:.0f} MiB idle | {flood.peak_rss / MIB:.0f} MiB peak "
            f"| {flood.peak_ratio:.2f}x | {_statuses(flood.statuses)} |"
        )
    for run in report.beside:
        same = "" if run.same_text else " (output differs from alone)"
        lines.append(
            f"| stream E2E beside {run.hostile} | {run.alone_e2e * 1000:.0f} ms | {run.beside_e2e * 1000:.0f} ms "
            f"| {run.e2e_ratio:.2f}x{same} | {_statuses(run.hostile_statuses)} |"
        )
        if run.alone_itl and run.beside_itl:
            lines.append(
                f"| stream ITL median beside {run.hostile} | {median(run.alone_itl) * 1000:.1f} ms "
                f"| {median(run.beside_itl) * 1000:.1f} ms | {run.itl_ratio:.2f}x | |"
            )
    return "\n".join(lines)
