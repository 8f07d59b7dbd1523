"""`tandem-bench hostile`: the ratios it prints, the inputs it sends, and its command line."""

from __future__ import annotations

import pytest
from tandem_bench.client import Endpoint
from tandem_bench.hostile import MIB, HostileReport, StreamBeside, TokenizeFlood, format_report
from tandem_bench.hostile_run import HostileConfig, build_parser, heavy_body, words_text


def test_ratios_are_taken_against_the_baseline_of_the_same_run() -> None:
    flood = TokenizeFlood(24, 2 * MIB, idle_rss=100 * MIB, peak_rss=400 * MIB, statuses={200: 20, 429: 4})
    beside = StreamBeside("probes", 2.0, 2.2, [0.04, 0.05, 0.06], [0.05, 0.05, 0.07], True, {200: 900})
    assert flood.peak_ratio == 4.0
    assert beside.e2e_ratio == pytest.approx(1.1)
    assert beside.itl_ratio == pytest.approx(1.0)
    table = format_report(HostileReport(tokenize=flood, beside=[beside]))
    assert "| 100 MiB idle | 400 MiB peak | 4.00x | 200: 20, 429: 4 |" in table
    assert "| 2000 ms | 2200 ms | 1.10x | 200: 900 |" in table
    assert "differs" not in table


def test_a_stream_that_changed_beside_the_load_is_flagged() -> None:
    beside = StreamBeside("heavy", 1.0, 1.0, [], [], False, {200: 1})
    assert "(output differs from alone)" in format_report(HostileReport(beside=[beside]))


def test_inputs_have_the_asked_sizes() -> None:
    assert len(words_text(10_000, 3)) == 10_000
    config = HostileConfig(Endpoint("x", "http://127.0.0.1:1"), None, 1, 1, 1, 0.0, 64, 300, 64, 16)
    body = heavy_body(config)
    assert (len(body["logit_bias"]), len(body["stop_token_ids"]), body["n"]) == (300, 64, 16)


def test_the_defaults_are_the_issue_sizes() -> None:
    args = build_parser().parse_args([])
    assert (args.tokenize_requests, args.probes, args.output_len) == (24, 200, 64)
    assert (args.logit_bias_entries, args.stop_token_ids, args.n) == (300, 64, 16)
