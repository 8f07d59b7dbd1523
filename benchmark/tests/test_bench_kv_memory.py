"""`tandem-bench kv-memory`: how many prompts fill the cache, distinct prompts, and the table it prints."""

from __future__ import annotations

from tandem_bench.kv_memory import MIB, FillPlan, KvMemoryReport, format_report, plan_fill
from tandem_bench.kv_memory_run import build_parser, prompt_text


def test_the_plan_sends_enough_long_prompts_to_overfill_the_cache() -> None:
    plan = plan_fill(kv_cache_tokens=16_384, max_input_tokens=4095, concurrency=8, output_len=64, fill=1.25)
    assert plan.prompt_tokens == int(4095 * 0.9) - 64
    assert plan.requests == 8 and plan.tokens >= 16_384 * 1.25


def test_a_small_cache_still_gets_one_wave_and_a_given_prompt_length_is_kept() -> None:
    assert plan_fill(1_000, 4095, concurrency=8, output_len=64, fill=1.25).requests == 8
    plan = plan_fill(46_576, 4095, concurrency=8, output_len=64, fill=1.25, prompt_tokens=2_800)
    assert (plan.prompt_tokens, plan.requests) == (2_800, 21)
    assert plan_fill(46_576, 1000, 8, 64, 1.0, prompt_tokens=5_000).prompt_tokens == 836


def test_prompts_differ_from_their_first_token() -> None:
    first, second = prompt_text(1, 50), prompt_text(2, 50)
    assert first.split()[0] != second.split()[0] and len(first.split()) == 51


def test_the_table_reports_idle_and_peak_memory_and_the_cache() -> None:
    report = KvMemoryReport(
        idle_rss=986 * MIB,
        peak_rss=1_480 * MIB,
        after_rss=1_400 * MIB,
        kv_cache_tokens=16_368,
        kv_cache_bytes=16_368 * 23_040,
        plan=FillPlan(prompt_tokens=3_621, output_len=64, requests=8, concurrency=8),
        prompt_tokens_sent=28_900,
        failed=0,
        peak_kv_usage=1.0,
        seconds=120.0,
    )
    table = format_report(report)
    assert "| shards' RSS idle | 986 MiB |" in table
    assert "| shards' RSS peak while filling the KV cache | 1,480 MiB |" in table
    assert "| KV cache | 16,368 tokens, 360 MiB |" in table
    assert "| peak share of KV blocks running requests held | 100% |" in table


def test_the_defaults_fill_with_eight_long_prompts_at_a_time() -> None:
    args = build_parser().parse_args([])
    assert (args.concurrency, args.output_len, args.fill, args.sample_interval) == (8, 64, 1.25, 0.2)
