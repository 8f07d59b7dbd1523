"""Aggregate figures of one run, as `vllm bench serve` reports them (latencies in milliseconds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tandem_bench.client import RequestResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Stats:
    """Mean, median, p90 and p99 of a latency, in milliseconds; all zero when there is no sample."""

    mean: float = 0.0
    median: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    count: int = 0


def stats_ms(values_s: list[float]) -> Stats:
    """Summarises samples given in seconds; percentiles interpolate linearly (numpy's default, as vLLM does)."""
    if not values_s:
        return Stats()
    values = np.asarray(values_s, dtype=float) * 1000.0
    median, p90, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
    return Stats(mean=float(values.mean()), median=median, p90=p90, p99=p99, count=len(values))


@dataclass(frozen=True)
class Summary:
    """Throughput and latency figures over the successful requests of one run."""

    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2e: Stats
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: list[RequestResult], duration_s: float, max_errors: int = 5) -> Summary:
    """Aggregates a run; ITL pools every gap of every request, TPOT averages per request (TTFT excluded)."""
    ok = [result for result in results if result.success]
    failed = [result for result in results if not result.success]
    # Prompt tokens come from `usage`; servers that omit it are counted in words (about one token each).
    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_words for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    tpots = [tpot for tpot in (r.tpot for r in ok) if tpot is not None]
    errors: list[str] = []
    for result in failed:
        if result.error not in errors and len(errors) < max_errors:
            errors.append(result.error)
    return Summary(
        completed=len(ok),
        failed=len(failed),
        duration_s=duration_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_throughput=len(ok) / duration,
        output_throughput=output_tokens / duration,
        total_token_throughput=(input_tokens + output_tokens) / duration,
        ttft=stats_ms([r.ttft for r in ok]),
        tpot=stats_ms(tpots),
        itl=stats_ms([gap for r in ok for gap in r.itl]),
        e2e=stats_ms([r.e2e for r in ok]),
        errors=errors,
    )
