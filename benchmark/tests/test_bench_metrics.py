"""Aggregate math on synthetic timings."""

from __future__ import annotations

import pytest
from tandem_bench.client import RequestResult
from tandem_bench.metrics import stats_ms, summarize


def _result(ttft: float, itl: list[float], tokens: int, prompt_tokens: int | None = 10) -> RequestResult:
    return RequestResult(
        success=True,
        prompt_words=8,
        prompt_tokens=prompt_tokens,
        output_tokens=tokens,
        ttft=ttft,
        itl=itl,
        e2e=ttft + sum(itl),
    )


def test_percentiles_interpolate_linearly_in_milliseconds() -> None:
    stats = stats_ms([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert stats.mean == pytest.approx(50.5)
    assert stats.median == pytest.approx(50.5)
    assert stats.p90 == pytest.approx(90.1)
    assert stats.p99 == pytest.approx(99.01)
    assert stats.count == 100


def test_stats_of_no_samples_are_zero() -> None:
    assert stats_ms([]).count == 0 and stats_ms([]).p99 == 0.0


def test_tpot_excludes_the_first_token() -> None:
    result = _result(ttft=0.5, itl=[0.1, 0.1, 0.1, 0.1], tokens=5)
    assert result.tpot == pytest.approx((0.9 - 0.5) / 4)


def test_tpot_is_undefined_for_one_token_or_failures() -> None:
    assert _result(ttft=0.5, itl=[], tokens=1).tpot is None
    assert RequestResult(success=False, output_tokens=5, e2e=1.0).tpot is None


def test_itl_pools_every_gap_of_every_request() -> None:
    # One long request must weigh by its gap count in ITL, but only once in TPOT.
    short = _result(ttft=0.1, itl=[0.010], tokens=2)
    long = _result(ttft=0.1, itl=[0.030] * 9, tokens=10)
    summary = summarize([short, long], duration_s=1.0)
    assert summary.itl.count == 10
    assert summary.itl.mean == pytest.approx((10 + 9 * 30) / 10)
    assert summary.tpot.count == 2
    assert summary.tpot.mean == pytest.approx((10 + 30) / 2)


def test_throughputs_count_only_successful_requests() -> None:
    ok = [_result(ttft=0.1, itl=[0.01] * 3, tokens=4), _result(ttft=0.2, itl=[0.01] * 3, tokens=4, prompt_tokens=None)]
    failed = [
        RequestResult(success=False, error="HTTP 503: busy"),
        RequestResult(success=False, error="HTTP 503: busy"),
    ]
    summary = summarize(ok + failed, duration_s=2.0)
    assert (summary.completed, summary.failed) == (2, 2)
    assert summary.output_tokens == 8
    assert summary.input_tokens == 10 + 8  # usage where reported, else words
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_throughput == pytest.approx(4.0)
    assert summary.total_token_throughput == pytest.approx(13.0)
    assert summary.ttft.mean == pytest.approx(150.0)
    assert summary.errors == ["HTTP 503: busy"]
