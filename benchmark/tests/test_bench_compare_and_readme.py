"""Several servers in one invocation, the report tables, and the README rewrite."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from bench_sse_server import Script, serve
from tandem_bench.cli import main, parse_server
from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.datasets import DatasetConfig
from tandem_bench.load import LoadPoint
from tandem_bench.metrics import summarize
from tandem_bench.readme import END_MARKER, START_MARKER, replace_between_markers
from tandem_bench.report import format_ratios, format_table
from tandem_bench.runner import BenchConfig, RunRecord, run_benchmark
from tandem_bench.suite import STANDARD_SUITE, equivalent_command, readme_block


def _compare(fast: Script, slow: Script) -> list[RunRecord]:
    async def go() -> list[RunRecord]:
        async with serve(fast) as fast_url, serve(slow) as slow_url:
            config = BenchConfig(
                endpoints=[Endpoint(name="fast", base_url=fast_url), Endpoint(name="slow", base_url=slow_url)],
                points=[LoadPoint(concurrency=1), LoadPoint(concurrency=2)],
                dataset=DatasetConfig(kind="fixed", num_prompts=2, input_len=8, output_len=4),
                warmup_requests=1,
                show_progress=False,
            )
            return await run_benchmark(config)

    return asyncio.run(go())


def test_compare_interleaves_servers_run_by_run_and_reports_ratios() -> None:
    fast = Script(first_delay_s=0.02, gaps_s=(0.01, 0.01, 0.01))
    slow = Script(first_delay_s=0.1, gaps_s=(0.01, 0.01, 0.01))
    records = _compare(fast, slow)
    assert [(r.server, r.point.concurrency) for r in records] == [("fast", 1), ("slow", 1), ("fast", 2), ("slow", 2)]
    assert all(r.summary.completed == 2 and r.summary.failed == 0 for r in records)
    assert records[1].summary.ttft.median > 2 * records[0].summary.ttft.median
    assert len(fast.received) == len(slow.received) == 1 + 2 + 2  # warm-up, then two runs of two prompts
    # Both servers get the same prompts in the same run.
    assert [b["prompt"] for b in fast.received[1:]] == [b["prompt"] for b in slow.received[1:]]
    # Each load point gets fresh prompts, and none repeats the warm-up's.
    prompts = [b["prompt"] for b in fast.received]
    assert len(set(prompts)) == 5
    assert not any(p.startswith(prompts[0].split()[0] + " " + prompts[0].split()[1]) for p in prompts[1:])
    ratios = format_ratios(records, "fast")
    rows = [line for line in ratios.splitlines() if line.startswith("| slow / fast")]
    assert len(rows) == 2
    ttft_ratio = float(rows[0].split("|")[5].strip().rstrip("x"))
    assert ttft_ratio > 2
    assert format_table(records).count("\n") == 5


def test_server_spec_accepts_a_name_or_a_bare_url() -> None:
    assert parse_server("vllm=http://127.0.0.1:8000") == ("vllm", "http://127.0.0.1:8000")
    assert parse_server("http://127.0.0.1:8080/") == ("127.0.0.1:8080", "http://127.0.0.1:8080/")


def test_cli_writes_json_results_and_plots(tmp_path: Path) -> None:
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0))

    async def go() -> int:
        async with serve(script) as url:
            argv = ["--base-url", url, "--num-prompts", "3", "--concurrency", "1", "2", "--no-progress"]
            argv += ["--output", str(tmp_path / "r.json"), "--plot-dir", str(tmp_path / "plots")]
            return await asyncio.to_thread(main, argv)

    assert asyncio.run(go()) == 0
    document = json.loads((tmp_path / "r.json").read_text())
    assert [run["load"] for run in document["runs"]] == ["concurrency=1", "concurrency=2"]
    assert document["runs"][0]["model"] == "fake-model"
    assert document["runs"][0]["summary"]["completed"] == 3
    assert document["command"].startswith("tandem-bench --base-url")
    for name in ("throughput.png", "latency_percentiles.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(b"\x89PNG")


def test_cli_exits_2_when_the_server_cannot_be_reached() -> None:
    assert main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "1", "--no-progress"]) == 2


def test_readme_block_is_replaced_between_markers_only() -> None:
    text = f"# T\n\nbefore\n{START_MARKER}\nold table\n{END_MARKER}\nafter\n"
    updated = replace_between_markers(text, "new table")
    assert updated == f"# T\n\nbefore\n{START_MARKER}\nnew table\n{END_MARKER}\nafter\n"
    assert replace_between_markers(updated, "new table") == updated


def test_readme_without_markers_is_an_error() -> None:
    with pytest.raises(ValueError, match="bench:start"):
        replace_between_markers("# no markers\n", "table")


def test_every_standard_suite_row_has_a_reproducing_command() -> None:
    commands = [equivalent_command(run) for run in STANDARD_SUITE]
    assert "--concurrency 16" in commands[2]
    assert "--dataset shared-prefix" in commands[3] and "--prefix-len 256" in commands[3]
    assert len({run.dataset.seed for run in STANDARD_SUITE}) == len(STANDARD_SUITE)
    assert all("ignore_eos" in command for command in commands)


def test_readme_block_has_one_row_per_suite_run_and_the_commands() -> None:
    summary = summarize([RequestResult(success=True, output_tokens=4, ttft=0.1, itl=[0.01] * 3, e2e=0.13)], 1.0)
    records = [RunRecord("tandem", "http://x", "m", run.point, summary) for run in STANDARD_SUITE]
    block = readme_block(STANDARD_SUITE, records, datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc), "a server")
    assert "2026-01-02 03:04 UTC" in block and "`make bench`" in block and "model `m`" in block
    rows = [line for line in block.splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(rows) == len(STANDARD_SUITE)
    assert "| 100 / 100 |" in rows[0]  # TTFT median / p99 in ms
    assert all(equivalent_command(run) in block for run in STANDARD_SUITE)
