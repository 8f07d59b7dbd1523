"""Several servers in one invocation, the report tables, and the README rewrite."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from bench_sse_server import Script, serve
from tandem_bench import suite
from tandem_bench.cli import main, parse_server
from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.datasets import DatasetConfig
from tandem_bench.load import LoadPoint
from tandem_bench.metrics import summarize
from tandem_bench.mfu import TransformerShape
from tandem_bench.peers import LaunchedLlamaServer, LlamaServerConfig, StaticBatchResult
from tandem_bench.readme import END_MARKER, START_MARKER, replace_between_markers
from tandem_bench.report import format_ratios, format_table
from tandem_bench.roofline import Roofline, model_matmuls
from tandem_bench.runner import BenchConfig, RunRecord, run_benchmark, warm_up
from tandem_bench.suite import STANDARD_SUITE, equivalent_command
from tandem_bench.suite_report import MeasuredRow, readme_block
from tandem_server.weight_defaults import cpu_multiplies_bfloat16


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


def test_warm_up_requests_are_sent_at_once_as_one_batch() -> None:
    script = Script(first_delay_s=0.2, gaps_s=(0.0, 0.0, 0.0))

    async def go() -> None:
        async with serve(script) as url:
            await warm_up(Endpoint(name="x", base_url=url, model="fake-model"), 4, seed=1)

    asyncio.run(go())
    assert (len(script.received), script.most_in_flight) == (4, 4)


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
    assert "--concurrency 1 " in commands[0] and "--output-len 128" in commands[0]
    assert "--concurrency 32" in commands[1] and "--input-len 50" in commands[1]
    assert "--input-len 1000" in commands[2] and "--concurrency 16" in commands[2]
    assert "--prefix-len 2000 --num-prefixes 16" in commands[3] and "--input-len 100" in commands[3]
    assert len({run.dataset.seed for run in STANDARD_SUITE}) == len(STANDARD_SUITE)
    assert all("ignore_eos" in command for command in commands)


TINY_SHAPE = TransformerShape(
    num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4, vocab_size=32
)
ROOFLINE = Roofline(
    square_flops=2e9, model_flops=1e9, bf16_square_flops=8e9, batch=32, copy_bytes_per_s=1e10, threads=2
)


def _record(server: str, output_tokens: int, duration_s: float) -> RunRecord:
    request = RequestResult(success=True, prompt_tokens=10, output_tokens=output_tokens, ttft=0.1, itl=[0.01], e2e=0.2)
    return RunRecord(server, "http://x", "m", LoadPoint(concurrency=1), summarize([request], duration_s))


def test_readme_block_has_a_row_per_server_and_workload_with_ratios_and_mfu() -> None:
    workloads = [run.workload for run in STANDARD_SUITE]
    rows = []
    for workload in workloads:
        tandem, peer, bf16 = _record("tandem", 8, 1.0), _record("llama-server", 8, 2.0), _record("tandem bf16", 8, 0.5)
        rows += [MeasuredRow(workload, tandem, tandem), MeasuredRow(workload, peer, tandem, precision=None)]
        rows.append(MeasuredRow(workload, bf16, tandem, precision="bfloat16"))
    static = StaticBatchResult(
        batch=32, input_len=50, output_len=128, seconds=4.0, output_throughput=16.0, decode_step_ms=9.0
    )
    static_bf16 = replace(static, seconds=2.0, output_throughput=32.0, dtype="bfloat16")
    baselines = [(workloads[1], static), (workloads[1], static_bf16)]
    block = readme_block("intro", rows, baselines, ROOFLINE, TINY_SHAPE, ["tandem-bench x"])
    table = [line for line in block.splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(table) == 3 * len(workloads) + 2
    assert "| llama-server | 1/0 | 4.0 | 0.50x |" in table[1] and table[1].endswith("| - |")  # no quantized peak
    # Each baseline follows Tandem's row of its workload, with the MFU of its own precision's peak.
    static_flops = 32 * (TINY_SHAPE.prefill_flops(50) + TINY_SHAPE.decode_flops(50, 128))
    assert "transformers static batch of 32, float32" in table[4] and "| 2.00x |" in table[4]
    assert table[4].endswith(f"| {static_flops / 4.0 / 2e9:.1%} |")
    assert "transformers static batch of 32, bfloat16" in table[5] and "| 4.00x |" in table[5]
    assert table[5].endswith(f"| {static_flops / 2.0 / 8e9:.1%} |")
    flops = TINY_SHAPE.prefill_flops(10) + TINY_SHAPE.decode_flops(10, 8)
    assert table[0].endswith(f"| {flops / 1.0 / 2e9:.1%} |")  # float32: the larger of the two float32 figures
    assert table[2].endswith(f"| {flops / 0.5 / 8e9:.1%} |")  # bfloat16: its own peak
    assert "2 torch threads" in block and "tandem-bench x" in block


def test_readme_block_never_breaks_a_flag_or_a_percentage_across_lines() -> None:
    # "--torch-" would end the first line at 114 characters, "compile" pass 120.
    intro = "servers: " + "a" * 96 + " (--torch-compile --kv-cache-memory 3GiB)"
    block = readme_block(intro, [], [], ROOFLINE, TINY_SHAPE, [])
    text = block.split("| workload")[0]
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "--torch-compile" in text and "--kv-cache-memory" in text
    assert "100%." in text


def test_static_baseline_bracketing_a_run_averages_its_time_not_its_rates() -> None:
    before = StaticBatchResult(
        batch=4, input_len=5, output_len=10, seconds=2.0, output_throughput=20.0, decode_step_ms=9.0
    )
    after = replace(before, seconds=8.0, output_throughput=5.0, decode_step_ms=30.0)
    mean = StaticBatchResult.mean([before, after])
    assert (mean.seconds, mean.output_throughput, mean.decode_step_ms, mean.runs) == (5.0, 8.0, 19.5, 2)
    tandem = _record("tandem", 8, 1.0)
    block = readme_block("intro", [MeasuredRow("w", tandem, tandem)], [("w", mean)], ROOFLINE, TINY_SHAPE, [])
    assert "transformers static batch of 4, float32 (mean of 2 runs, before and after) | 4/0 | 8.0 |" in block


def test_the_static_baselines_bracket_the_tandem_runs_and_the_peers_run_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []
    static = StaticBatchResult(
        batch=4, input_len=5, output_len=10, seconds=2.0, output_throughput=20.0, decode_step_ms=9.0
    )

    def fake_static(run: suite.SuiteRun, dtype: str) -> StaticBatchResult:
        order.append(f"static {dtype}")
        return replace(static, dtype=dtype)

    def fake_row(run: suite.SuiteRun, endpoints: list[Endpoint], show_progress: bool) -> list[RunRecord]:
        order.append("+".join(endpoint.name for endpoint in endpoints))
        return [_record(endpoint.name, 8, 1.0) for endpoint in endpoints]

    monkeypatch.setattr(suite, "_static_baseline", fake_static)
    monkeypatch.setattr(suite, "run_row", fake_row)
    tandems = [Endpoint(name=name, base_url="http://x") for name in ("tandem", "variant")]
    peers = [Endpoint(name="llama", base_url="http://x")]
    dtypes = ("float32", "bfloat16")
    records, baselines = suite.measure_workload(STANDARD_SUITE[1], tandems, peers, dtypes, show=False)
    assert order == [
        "static float32", "static bfloat16", "tandem+variant", "static float32", "static bfloat16", "llama",
    ]  # fmt: skip
    assert [record.server for record in records] == ["tandem", "variant", "llama"]
    assert [(baseline.dtype, baseline.runs) for baseline in baselines] == [("float32", 2), ("bfloat16", 2)]
    order.clear()
    records, baselines = suite.measure_workload(STANDARD_SUITE[1], tandems, peers, (), show=False)
    assert (order, baselines) == (["tandem+variant+llama"], [])


def test_static_dtypes_parse_in_order_without_repeats_and_reject_unknown_names() -> None:
    assert suite.parse_static_dtypes("bfloat16, float32,bfloat16") == ("bfloat16", "float32")
    for text in ("", "float16", "float32,int8"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected dtypes among float32, bfloat16"):
            suite.parse_static_dtypes(text)


def test_roofline_decode_matmuls_are_the_mfu_counts_matmul_weights() -> None:
    matmuls = model_matmuls(TINY_SHAPE, batch=3)
    flops = sum(2 * rows * inner * columns * times for rows, inner, columns, times in matmuls)
    assert flops == 2 * 3 * TINY_SHAPE.matmul_params


def test_a_llama_server_that_exits_at_start_is_reported(tmp_path: Path) -> None:
    config = LlamaServerConfig(binary=Path("/bin/false"), gguf=tmp_path / "model.gguf", parallel=4, slot_context=256)
    server = LaunchedLlamaServer(config, tmp_path / "llama.log")
    assert server.args[server.args.index("--ctx-size") + 1] == "1024"
    with pytest.raises(RuntimeError, match="llama-server did not become ready"):
        server.__enter__()


def test_the_suite_measures_every_workload_and_rewrites_the_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite's own orchestration against the fake streaming server; the roofline and the model shape are faked
    # too, since this test is about the runs, the table and the results file, not the machine.
    monkeypatch.setattr(suite, "_embedded_model_shape", lambda: TINY_SHAPE)
    monkeypatch.setattr(suite, "measure_roofline", lambda shape, batch: ROOFLINE)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{START_MARKER}\nold\n{END_MARKER}\n")
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0))
    ready = threading.Event()
    urls: list[str] = []

    async def serve_until_done(done: asyncio.Event) -> None:
        async with serve(script) as url:
            urls.append(url)
            ready.set()
            await done.wait()

    loop = asyncio.new_event_loop()
    done = asyncio.Event()
    server = threading.Thread(target=loop.run_until_complete, args=(serve_until_done(done),))
    server.start()
    try:
        assert ready.wait(10)
        argv = ["--base-url", urls[0], "--compare", f"peer={urls[0]}", "--no-static", "--no-progress"]
        status = suite.main([*argv, "--readme", str(readme), "--output-dir", str(tmp_path / "out")])
    finally:
        loop.call_soon_threadsafe(done.set)
        server.join(10)
    assert status == 0
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(rows) == 2 * len(STANDARD_SUITE)  # Tandem and the peer; no cache-off run against a given --base-url
    assert all(row.endswith("| - |") for row in rows[1::2])  # a peer's precision is unknown
    assert (tmp_path / "docs" / "images" / "bench-suite.png").stat().st_size > 0
    assert "](docs/images/bench-suite.png)" in readme.read_text()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [run["workload"] for run in results["runs"][::2]] == [run.workload for run in STANDARD_SUITE]
    # Before each workload, each server gets one warm-up request per concurrent stream.
    warmups = sum(run.point.concurrency or 1 for run in STANDARD_SUITE)
    assert len(script.received) == 2 * (sum(run.dataset.num_prompts for run in STANDARD_SUITE) + warmups)


def test_a_variant_multiplies_in_its_dtype_unless_its_weights_are_quantized() -> None:
    # The embedded model is a GGUF: the defaults serve its quantized blocks.
    assert suite._precision([]) is None
    assert suite._precision(["--quantize", "none"]) == ("bfloat16" if cpu_multiplies_bfloat16() else "float32")
    assert suite._precision(["--quantize", "none", "--dtype", "float32"]) == "float32"
    assert suite._precision(["--quantize", "none", "--dtype", "bfloat16", "--kv-cache-memory", "3GiB"]) == "bfloat16"
    assert suite._precision(["--quantize", "none", "--dtype", "bfloat16"]) == "bfloat16"
    # Quantized kernels have no roofline figure: no MFU rather than one against the float32 peak.
    assert suite._precision(["--quantize", "gguf"]) is None
    assert suite._precision(["--dtype", "bfloat16", "--quantize", "int4"]) is None
