"""Reads Prometheus text exposition into plain numbers: enough to difference histograms between two scrapes."""

from __future__ import annotations

from dataclasses import dataclass


def parse_samples(text: str) -> dict[str, float]:
    """Every sample line as `series -> value`, where series keeps its labels (`name{a="b"}`) as exposed."""
    samples: dict[str, float] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        # Label values may contain spaces, so the value is whatever follows the closing brace.
        head, brace, tail = line.rpartition("}")
        series, _, value = (head + brace, " ", tail.strip()) if brace else line.partition(" ")
        try:
            samples[series.strip()] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return samples


def _metric_name(series: str) -> str:
    return series.partition("{")[0]


def total(samples: dict[str, float], name: str) -> float:
    """The sum of every series of metric `name` over all its label sets (0 when absent)."""
    return sum(value for series, value in samples.items() if _metric_name(series) == name)


@dataclass(frozen=True)
class HistogramDelta:
    """What a histogram observed between two scrapes."""

    total: float
    count: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> HistogramDelta:
    """Sum and count of the observations `name` recorded between the `before` and `after` scrapes."""
    return HistogramDelta(
        total=total(after, f"{name}_sum") - total(before, f"{name}_sum"),
        count=total(after, f"{name}_count") - total(before, f"{name}_count"),
    )
