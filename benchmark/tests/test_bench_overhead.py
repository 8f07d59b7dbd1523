"""The overhead arithmetic over two /metrics scrapes, without a server."""

from __future__ import annotations

import pytest
from tandem_bench.overhead import format_table, step_breakdown
from tandem_bench.overhead_run import format_comparison
from tandem_bench.prometheus import histogram_delta, parse_samples


def _scrape(steps: int, scale: float) -> str:
    """A router-shaped exposition after `steps` identical steps of `scale` times the base timings."""
    parts = {
        "tandem_step_duration_seconds": 0.020,
        "tandem_step_scheduling_duration_seconds": 0.001,
        "tandem_step_shard_duration_seconds": 0.018,
        "tandem_step_prepare_duration_seconds": 0.002,
        "tandem_step_forward_duration_seconds": 0.012,
        "tandem_step_sampling_duration_seconds": 0.003,
        "tandem_step_forward_gap_seconds": 0.006,
    }
    lines = ["# TYPE tandem_step_duration_seconds histogram"]
    for name, seconds in parts.items():
        lines.append(f'{name}_bucket{{le="+Inf"}} {steps}')
        lines.append(f"{name}_sum {seconds * scale * steps}")
        lines.append(f"{name}_count {steps}")
    lines += [f"tandem_batch_size_sum {8 * steps}", f"tandem_batch_size_count {steps}"]
    lines += [f"tandem_batch_tokens_sum {8 * steps}", f"tandem_batch_tokens_count {steps}"]
    return "\n".join(lines) + "\n"


def test_parse_samples_keeps_labels_and_skips_comments() -> None:
    samples = parse_samples('# HELP x y\nx_total 3\ny{route="a b",code="200"} 4.5\nbroken line here\n')
    assert samples == {"x_total": 3.0, 'y{route="a b",code="200"}': 4.5}


def test_histogram_delta_sums_every_label_set() -> None:
    before = parse_samples('h_sum{rank="0"} 1\nh_count{rank="0"} 2\nh_sum{rank="1"} 1\nh_count{rank="1"} 2\n')
    after = parse_samples('h_sum{rank="0"} 4\nh_count{rank="0"} 4\nh_sum{rank="1"} 3\nh_count{rank="1"} 4\n')
    delta = histogram_delta(before, after, "h")
    assert (delta.total, delta.count, delta.mean) == (5.0, 4.0, 1.25)


def test_breakdown_counts_only_steps_between_scrapes() -> None:
    # 10 warm-up steps twice as slow, then 40 measured steps at the base timings.
    before = parse_samples(_scrape(10, scale=2.0))
    after_text = _scrape(40, scale=1.0)
    after = {key: value + before[key] for key, value in parse_samples(after_text).items()}
    row = step_breakdown(before, after, window_s=0.84, requested_batch=8)
    assert row.steps == 40
    assert row.mean_batch == pytest.approx(8.0)
    assert row.round_trip_ms == pytest.approx(20.0)
    assert row.transport_ms == pytest.approx(2.0)
    assert row.shard_rest_ms == pytest.approx(1.0)
    assert row.step_ms == pytest.approx(21.0)
    assert row.overhead_ms == pytest.approx(9.0)
    assert row.overhead_pct == pytest.approx(100.0 * 9.0 / 21.0)
    assert row.forward_gap_ms == pytest.approx(6.0)
    assert row.tokens_per_s == pytest.approx(320 / 0.84)
    table = format_table([row])
    assert "| 8 | 8.0 | 40 | 21.00 | 1.00 | 2.00 | 2.00 | 12.00 | 3.00 | 1.00 | 6.00 | 9.00 | 42.9% | 381 |" in table


def test_the_step_is_the_wall_clock_per_step_when_steps_overlap() -> None:
    # Two steps in flight: each round trip spans two forward passes, yet 40 steps took 40 x 13 ms.
    before = parse_samples(_scrape(0, scale=1.0))
    after = parse_samples(_scrape(40, scale=1.0))
    row = step_breakdown(before, after, window_s=0.52, requested_batch=8)
    assert row.step_ms == pytest.approx(13.0)
    assert row.overhead_ms == pytest.approx(1.0)


def test_breakdown_without_steps_is_an_error() -> None:
    samples = parse_samples(_scrape(5, scale=1.0))
    with pytest.raises(ValueError, match="no step ran"):
        step_breakdown(samples, samples, window_s=1.0, requested_batch=1)


def test_the_comparison_gives_ratios_of_gap_and_throughput_per_batch() -> None:
    before = parse_samples(_scrape(0, scale=1.0))
    sync = step_breakdown(before, parse_samples(_scrape(40, scale=1.0)), window_s=0.84, requested_batch=1)
    overlapped = step_breakdown(before, parse_samples(_scrape(40, scale=0.5)), window_s=0.42, requested_batch=1)
    # Gap 6 ms with 3 of sampling, against 3 ms with 1.5 of sampling.
    assert "| 1 | 6.00 | 3.00 | 0.50x | 0.50x | 381.0 | 761.9 | 2.00x |" in format_comparison([sync], [overlapped])
