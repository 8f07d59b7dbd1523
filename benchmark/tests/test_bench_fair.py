"""`tandem-bench fair`: the burst and trickle against a stand-in SSE server, and the figures' arithmetic."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from bench_sse_server import Script, serve
from tandem_bench.cli import SUBCOMMANDS
from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.fair_run import PolicyFigures, build_parser, burst, format_figures, median_ttft, trickle


def test_fair_is_a_subcommand_whose_burst_queues_behind_a_small_batch() -> None:
    assert "fair" in SUBCOMMANDS
    args = build_parser().parse_args([])
    assert (args.burst, args.trickle, args.interval, args.max_batch_size) == (64, 8, 1.0, 8)
    assert args.burst > args.max_batch_size
    assert args.policies == ["fcfs", "fair"]
    assert build_parser().parse_args(["--policies", "fair"]).policies == ["fair"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--policies", "lottery"])


def test_the_figure_is_the_median_under_the_burst_over_the_median_alone() -> None:
    results = [RequestResult(success=True, ttft=t) for t in (0.1, 0.3, 0.2)] + [RequestResult(success=False, ttft=9)]
    assert median_ttft(results) == 0.2
    assert median_ttft([RequestResult(success=False)]) == 0.0
    figures = [PolicyFigures("fcfs", 0.05, 2.0, 0), PolicyFigures("fair", 0.05, 0.08, 1, (0.07, 0.08, 0.0912))]
    assert [figure.ratio for figure in figures] == pytest.approx([40.0, 1.6])
    assert figures[1].to_dict()["ttfts_under_burst_ms"] == [70.0, 80.0, 91.2]
    table = format_figures(figures, build_parser().parse_args(["--burst", "16"]))
    assert "key A: 16 requests at once" in table
    assert "| fcfs | 50 | 2000 | 40.00x | 0 |" in table
    assert "| fair | 50 | 80 | 1.60x | 1 |" in table


def test_the_trickle_spaces_its_requests_and_the_burst_sends_them_at_once_with_each_key() -> None:
    script = Script(first_delay_s=0.01, gaps_s=(0.0, 0.0, 0.0))

    async def run() -> tuple[list[RequestResult], list[RequestResult]]:
        async with serve(script) as base_url, aiohttp.ClientSession() as session:
            spaced = await trickle(session, Endpoint("b", base_url, api_key="sk-b"), 3, 0.1, 4)
            at_once = await burst(session, Endpoint("a", base_url, api_key="sk-a"), 5, 4)
        return spaced, at_once

    spaced, at_once = asyncio.run(run())
    assert [result.success for result in spaced + at_once] == [True] * 8
    gaps = [later - earlier for earlier, later in zip(script.arrivals[:3], script.arrivals[1:3], strict=False)]
    assert all(gap >= 0.09 for gap in gaps), gaps
    assert script.arrivals[7] - script.arrivals[3] < 0.09, "the burst went out at once"
    assert script.authorizations == ["Bearer sk-b"] * 3 + ["Bearer sk-a"] * 5
