"""`tandem-bench soak`: durations, the arrival and cancellation plan, memory figures, and the client that hangs up."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from bench_sse_server import Script, serve
from tandem_bench.client import Endpoint
from tandem_bench.soak import (
    MIB,
    Sample,
    SoakCounts,
    SoakSummary,
    failures_by_reason,
    format_summary,
    parse_duration,
    plan_streams,
    process_role,
    role_memory,
)
from tandem_bench.soak_run import SoakConfig, build_parser, open_loop


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0)])
def test_durations_take_seconds_minutes_and_hours(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10 min", "-5m", "0s", "m"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_the_cli_refuses_a_bad_duration_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--duration", "soon"])
    assert exit_info.value.code == 2 and "not a duration such as 90s, 10m or 1h: 'soon'" in capsys.readouterr().err
    defaults = build_parser().parse_args([])
    assert (defaults.duration, defaults.load_fraction, defaults.cancel_fraction) == (1800.0, 0.5, 0.2)


def test_processes_are_attributed_to_router_shards_or_launcher() -> None:
    assert process_role(["/venv/bin/tandem-router", "--port", "3000"]) == "router"
    assert process_role(["/venv/bin/python", "/venv/bin/tandem-shard", "--rank", "0"]) == "shards"
    assert process_role(["python", "-m", "tandem_launcher"]) == "launcher"


def test_arrivals_follow_the_rate_and_a_fraction_is_cancelled() -> None:
    plans = plan_streams(rate=10.0, duration=1000.0, cancel_fraction=0.2, output_len=64, seed=3)
    assert plans == plan_streams(rate=10.0, duration=1000.0, cancel_fraction=0.2, output_len=64, seed=3)
    starts = [plan.start for plan in plans]
    assert starts[0] == 0.0 and starts == sorted(starts) and starts[-1] < 1000.0
    assert 9_700 < len(plans) < 10_300
    cut = [plan.cancel_after_chunks for plan in plans if plan.cancel_after_chunks is not None]
    assert 0.18 < len(cut) / len(plans) < 0.22
    assert min(cut) == 1 and max(cut) == 63


def test_single_token_streams_are_never_cancelled_and_bad_plans_are_refused() -> None:
    plans = plan_streams(rate=5.0, duration=20.0, cancel_fraction=1.0, output_len=1, seed=0)
    assert plans and all(plan.cancel_after_chunks is None for plan in plans)
    with pytest.raises(ValueError, match="rate must be positive"):
        plan_streams(rate=0.0, duration=20.0, cancel_fraction=0.2, output_len=8, seed=0)
    with pytest.raises(ValueError, match="cancel fraction"):
        plan_streams(rate=1.0, duration=20.0, cancel_fraction=1.5, output_len=8, seed=0)


def sample(elapsed: float, router_mib: float) -> Sample:
    return Sample(elapsed, {"router": int(router_mib * MIB)}, kv_blocks_used=0, running=0, queued=0)


def test_memory_growth_peak_and_hourly_trend() -> None:
    samples = [sample(60.0 * minute, 100.0 + minute) for minute in range(11)] + [sample(660.0, 105.0)]
    memory = role_memory(samples, "router")
    assert memory is not None
    assert (memory.start_mib, memory.end_mib, memory.peak_mib) == (100.0, 105.0, 110.0)
    assert memory.growth_mib == 5.0 and memory.growth_percent == 5.0
    steady = role_memory([sample(60.0 * minute, 100.0 + minute) for minute in range(11)], "router")
    assert steady is not None and steady.trend_mib_per_hour == pytest.approx(60.0)
    assert role_memory(samples, "shards") is None


def test_summary_reports_every_figure_and_serialises_to_json() -> None:
    counts = SoakCounts(sent=10, completed=7, cancelled_by_client=2, server_cancelled=2.0)
    counts.server_failures = {"cancelled": 2.0}
    counts.record_error("HTTP 500: boom")
    summary = SoakSummary(
        duration_s=600.0,
        capacity_rps=2.0,
        target_rps=1.0,
        achieved_rps=0.98,
        counts=counts,
        memory={"router": role_memory([sample(0.0, 50.0), sample(600.0, 51.0)], "router")},
        idle_kv_blocks_used=0.0,
        idle_prefix_cache_blocks=12.0,
        samples=[sample(0.0, 50.0), sample(600.0, 51.0)],
    )
    text = format_summary(summary)
    assert "capacity 2.00 req/s, target 1.00 req/s, achieved 0.98 req/s" in text
    assert "10 sent, 7 completed, 2 cancelled by the client, 1 errors; router counted 2 cancelled" in text
    assert "failures by reason cancelled 2" in text
    assert "0 KV blocks held by requests, 12 kept by the prefix cache" in text
    assert "router RSS: 50.0 -> 51.0 MiB (+1.0 MiB, +2.0%)" in text and "error: HTTP 500: boom" in text
    decoded = json.loads(json.dumps(summary.to_dict()))
    assert decoded["counts"]["errors"] == 1 and decoded["memory"]["router"]["growth_mib"] == 1.0


def test_open_loop_completes_or_hangs_up_as_planned() -> None:
    script = Script(first_delay_s=0.01, pieces=("a", "b", "c", "d"), gaps_s=(0.05, 0.05, 0.05))
    plans = plan_streams(rate=50.0, duration=0.4, cancel_fraction=0.5, output_len=4, seed=1)

    async def go() -> object:
        async with serve(script) as base_url, aiohttp.ClientSession() as session:
            endpoint = Endpoint(name="fake", base_url=base_url, model="m")
            config = SoakConfig(endpoint, 0.4, 0.5, 0.5, 4, 4, 1.0, 1, 1.0, seed=1, server_pid=None)
            return await open_loop(session, config, plans)

    counts = asyncio.run(go())
    cancelled = sum(1 for plan in plans if plan.cancel_after_chunks is not None)
    assert 0 < cancelled < len(plans)
    assert (counts.sent, counts.errors) == (len(plans), 0), counts.error_examples
    assert counts.cancelled_by_client == cancelled and counts.completed == len(plans) - cancelled


def test_router_failures_are_split_by_reason_between_two_scrapes() -> None:
    before = {'tandem_request_failure_total{reason="cancelled"}': 3.0, "tandem_requests_total": 9.0}
    after = {
        'tandem_request_failure_total{reason="cancelled"}': 5.0,
        'tandem_request_failure_total{reason="shard_error"}': 1.0,
        'tandem_request_failure_total{reason="validation"}': 0.0,
        "tandem_requests_total": 20.0,
    }
    assert failures_by_reason(before, after) == {"cancelled": 2.0, "shard_error": 1.0}
