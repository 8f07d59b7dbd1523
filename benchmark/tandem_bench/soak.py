"""The pure parts of `tandem-bench soak`: durations, the cancellation plan, memory samples and the summary."""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MIB = 1024 * 1024

# Which server process a command line belongs to; anything else in the tree counts as the launcher.
ROLES = (("tandem-router", "router"), ("tandem-shard", "shards"), ("tandem_server", "shards"))


_REASON = re.compile(r'reason="([^"]*)"')


def failures_by_reason(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How many `tandem_request_failure_total` grew per `reason` label between two scrapes (zero ones left out)."""
    grown: dict[str, float] = {}
    for series, value in after.items():
        if series.partition("{")[0] != "tandem_request_failure_total":
            continue
        match = _REASON.search(series)
        reason = match.group(1) if match else ""
        delta = value - before.get(series, 0.0)
        if delta:
            grown[reason] = grown.get(reason, 0.0) + delta
    return dict(sorted(grown.items()))


def _reasons(failures: dict[str, float]) -> str:
    return ", ".join(f"{reason} {count:.0f}" for reason, count in failures.items()) or "none"


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `10m`, `1.5h`; raises ValueError on anything else or on zero."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration such as 90s, 10m or 1h: {text!r}")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds


def process_role(cmdline: list[str]) -> str:
    """`router`, `shards` or `launcher` for a process of the server's tree, from its command line."""
    joined = " ".join(cmdline)
    for needle, role in ROLES:
        if needle in joined:
            return role
    return "launcher"


@dataclass(frozen=True)
class StreamPlan:
    """One open-loop request: when it starts (s from the soak start) and after how many chunks it hangs up."""

    start: float
    cancel_after_chunks: int | None


def plan_streams(rate: float, duration: float, cancel_fraction: float, output_len: int, seed: int) -> list[StreamPlan]:
    """Poisson arrivals at `rate`/s over `duration` s; a `cancel_fraction` of them closes after 1..output_len-1
    chunks (a stream of one token cannot be cut short, so none is cancelled then)."""
    if rate <= 0 or not 0 <= cancel_fraction <= 1:
        raise ValueError("the rate must be positive and the cancel fraction within [0, 1]")
    rng = np.random.default_rng(seed)
    chooser = random.Random(seed)
    plans, now = [], 0.0
    while now < duration:
        cancels = output_len > 1 and chooser.random() < cancel_fraction
        plans.append(StreamPlan(now, chooser.randint(1, output_len - 1) if cancels else None))
        now += float(rng.exponential(1.0 / rate))
    return plans


@dataclass(frozen=True)
class Sample:
    """Resident memory per role (bytes) and the router's load gauges at `elapsed` s into the soak."""

    elapsed: float
    rss: dict[str, int]
    kv_blocks_used: float
    running: float
    queued: float


@dataclass
class SoakCounts:
    """What the clients saw and what the router counted over the soak phase."""

    sent: int = 0
    completed: int = 0
    cancelled_by_client: int = 0
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    server_cancelled: float = 0.0
    # `tandem_request_failure_total` by reason; `cancelled` there counts streams whose client went away.
    server_failures: dict[str, float] = field(default_factory=dict)

    def record_error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_examples) < 5:
            self.error_examples.append(message[:300])


@dataclass(frozen=True)
class RoleMemory:
    """One role's resident memory over the soak: first and last sample, peak, and the fitted trend."""

    start_mib: float
    end_mib: float
    peak_mib: float
    growth_mib: float
    growth_percent: float
    trend_mib_per_hour: float


def role_memory(samples: list[Sample], role: str) -> RoleMemory | None:
    """The memory figures of `role`, or None when no sample has it (e.g. the server ran elsewhere)."""
    points = [(sample.elapsed, sample.rss[role] / MIB) for sample in samples if role in sample.rss]
    if not points:
        return None
    times, values = zip(*points, strict=True)
    trend = float(np.polyfit(times, values, 1)[0]) * 3600.0 if len(set(times)) > 1 else 0.0
    start, end = values[0], values[-1]
    return RoleMemory(
        start_mib=start,
        end_mib=end,
        peak_mib=max(values),
        growth_mib=end - start,
        growth_percent=100.0 * (end - start) / start if start else 0.0,
        trend_mib_per_hour=trend,
    )


@dataclass(frozen=True)
class SoakSummary:
    """Everything `tandem-bench soak` reports and writes as JSON."""

    duration_s: float
    capacity_rps: float
    target_rps: float
    achieved_rps: float
    counts: SoakCounts
    memory: dict[str, RoleMemory]
    idle_kv_blocks_used: float
    idle_prefix_cache_blocks: float
    samples: list[Sample]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_summary(summary: SoakSummary) -> str:
    """A short human-readable report."""
    counts = summary.counts
    lines = [
        f"soak {summary.duration_s:.0f}s: capacity {summary.capacity_rps:.2f} req/s, "
        f"target {summary.target_rps:.2f} req/s, achieved {summary.achieved_rps:.2f} req/s",
        f"requests: {counts.sent} sent, {counts.completed} completed, {counts.cancelled_by_client} cancelled by "
        f"the client, {counts.errors} errors; router counted {counts.server_cancelled:.0f} cancelled "
        f"(tandem_cancelled_requests_total), failures by reason {_reasons(counts.server_failures)}",
        f"idle after the soak: {summary.idle_kv_blocks_used:.0f} KV blocks held by requests, "
        f"{summary.idle_prefix_cache_blocks:.0f} kept by the prefix cache",
    ]
    for role, memory in summary.memory.items():
        lines.append(
            f"{role:>8} RSS: {memory.start_mib:.1f} -> {memory.end_mib:.1f} MiB "
            f"({memory.growth_mib:+.1f} MiB, {memory.growth_percent:+.1f}%), peak {memory.peak_mib:.1f} MiB, "
            f"trend {memory.trend_mib_per_hour:+.1f} MiB/h"
        )
    lines += [f"error: {example}" for example in counts.error_examples]
    return "\n".join(lines)
