"""`make bench`: the standard workloads on Tandem and its peers in one run, written into the README.

Starts Tandem through the launcher (and, when asked, Tandem variants and llama.cpp's `llama-server` on the same GGUF),
measures the machine's roofline and the `transformers` static-batching baseline in each asked dtype, runs every workload
interleaved across the servers, then a second Tandem with the prefix cache off for the shared-prefix workload, and
rewrites the README's table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from tandem_server.weight_defaults import cpu_multiplies_bfloat16

from tandem_bench.cli import parse_server
from tandem_bench.client import Endpoint
from tandem_bench.datasets import DatasetConfig
from tandem_bench.load import LoadPoint
from tandem_bench.mfu import TransformerShape
from tandem_bench.peers import LaunchedLlamaServer, LlamaServerConfig, StaticBatchResult, run_transformers_static
from tandem_bench.plots import write_plots
from tandem_bench.readme import replace_between_markers
from tandem_bench.report import format_ratios, format_run
from tandem_bench.results import write_results
from tandem_bench.roofline import Roofline, measure_roofline
from tandem_bench.runner import BenchConfig, RunRecord, run_benchmark_sync
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.suite_plot import plot_suite
from tandem_bench.suite_report import MeasuredRow, readme_block

# Every request generates exactly its output length, so runs on different servers do the same work.
EXTRA_BODY = {"ignore_eos": True}
SUITE_COMMAND = "make bench"
SUITE_CHART = "docs/images/bench-suite.png"
# Tandem is measured as users get it, with no flags. The comparison server without a prefix cache lets the
# shared-prefix workload's 16 concurrent 2,100-token prompts queue for the minute of prefill they take on 2 cores, as
# llama-server does, instead of failing them at the default --max-queue-time of 60 s.
CACHE_OFF_ARGS = ["--prefix-caching", "false", "--max-queue-time", "600"]
ROOFLINE_BATCH = 32
STATIC_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class SuiteRun:
    """One workload; `cache_off` also runs it on a Tandem without prefix caching, `static` on transformers."""

    workload: str
    dataset: DatasetConfig
    point: LoadPoint
    cache_off: bool = False
    static: bool = False


def _fixed(num_prompts: int, input_len: int, output_len: int, seed: int) -> DatasetConfig:
    return DatasetConfig(kind="fixed", num_prompts=num_prompts, input_len=input_len, output_len=output_len, seed=seed)


# Every row has its own seed: no row may reuse prompts (and so cached prefixes) of an earlier one.
STANDARD_SUITE: tuple[SuiteRun, ...] = (
    SuiteRun("single stream, 50 in / 128 out", _fixed(4, 50, 128, seed=1), LoadPoint(concurrency=1)),
    SuiteRun("decode-heavy, 50 in / 128 out", _fixed(32, 50, 128, seed=2), LoadPoint(concurrency=32), static=True),
    SuiteRun("prefill-heavy, 1000 in / 32 out", _fixed(16, 1000, 32, seed=3), LoadPoint(concurrency=16)),
    # 8 requests per prefix, as agents reuse one system prompt many times: each prefix is cold once, so with 8 uses
    # a perfect cache saves at most 5.2x the prefill (4 uses: 3.3x).
    SuiteRun(
        "shared prefix, 128 over 16 x 2000 + 100 in / 64 out",
        DatasetConfig(
            kind="shared-prefix",
            num_prompts=128,
            prefix_len=2000,
            num_prefixes=16,
            input_len=100,
            output_len=64,
            seed=4,
        ),
        LoadPoint(concurrency=16),
        cache_off=True,
    ),
)


def equivalent_command(run: SuiteRun) -> str:
    """The `tandem-bench` invocation that reproduces one suite row against a running server."""
    d = run.dataset
    args = ["tandem-bench", "--dataset", d.kind, "--num-prompts", str(d.num_prompts)]
    args += ["--input-len", str(d.input_len), "--output-len", str(d.output_len)]
    if d.kind == "shared-prefix":
        args += ["--prefix-len", str(d.prefix_len), "--num-prefixes", str(d.num_prefixes)]
    args += ["--seed", str(d.seed), "--concurrency", str(run.point.concurrency)]
    args += ["--extra-body", '{"ignore_eos": true}']
    return shlex.join(args)


def run_row(run: SuiteRun, endpoints: list[Endpoint], show_progress: bool) -> list[RunRecord]:
    """One workload on every endpoint, interleaved; the first endpoint is the baseline of the printed ratios.

    Each server first gets one warm-up request per concurrent stream, all at once, so the first batch of the
    workload's size (and whatever a server allocates for it) is not measured: the `transformers` baseline too runs
    a full-batch prefill before its timed run.
    """
    warmup = run.point.concurrency or 1
    config = BenchConfig(endpoints, [run.point], run.dataset, warmup_requests=warmup, show_progress=show_progress)
    records = run_benchmark_sync(config)
    for record in records:
        print(format_run(record), flush=True)
    if len(records) > 1:
        print(format_ratios(records, endpoints[0].name), flush=True)
    return records


def _load_average() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def _embedded_model_shape() -> TransformerShape:
    # The launcher converts the embedded GGUF on its first start; the suite reads the shape it wrote.
    from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR  # noqa: PLC0415
    from tandem_launcher.embedded import converted_model_dir, embedded_gguf  # noqa: PLC0415

    config = converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR) / "config.json"
    return TransformerShape.from_hf_config(json.loads(config.read_text()))


def _embedded_gguf_path() -> Path:
    from tandem_launcher.embedded import embedded_gguf  # noqa: PLC0415

    return embedded_gguf().path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tandem_bench.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="measure this running Tandem instead of starting one")
    parser.add_argument("--compare", nargs="+", default=[], metavar="NAME=URL", help="running peers to measure too")
    parser.add_argument(
        "--tandem-variant",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="also start Tandem with these extra launcher arguments, e.g. 'bf16=--dtype bfloat16'",
    )
    parser.add_argument("--llama-server", type=Path, default=None, help="start this llama-server binary as a peer")
    parser.add_argument("--llama-server-args", default="", help="more llama-server arguments, e.g. '--no-repack'")
    parser.add_argument("--no-static", action="store_true", help="skip the transformers static-batching baseline")
    parser.add_argument(
        "--static-dtypes",
        type=parse_static_dtypes,
        default=("float32",),
        help="dtypes the transformers baseline runs in, comma-separated: float32 (default), bfloat16 or both",
    )
    parser.add_argument("--readme", type=Path, default=Path("README.md"), help="README to rewrite")
    parser.add_argument("--output-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def parse_static_dtypes(text: str) -> tuple[str, ...]:
    """`float32,bfloat16` -> ("float32", "bfloat16"); every name must be a dtype the baseline script accepts."""
    dtypes = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in dtypes if name not in STATIC_DTYPES]
    if not dtypes or unknown:
        raise argparse.ArgumentTypeError(f"expected dtypes among {', '.join(STATIC_DTYPES)}, got {text!r}")
    return dtypes


def main(argv: list[str] | None = None) -> int:
    """Starts the servers, runs the suite, writes results, plots and the README table; 1 when a request failed."""
    args = build_parser().parse_args(argv)
    when = datetime.now(timezone.utc)
    load_before = _load_average()
    show = not args.no_progress
    measured: list[MeasuredRow] = []
    try:
        with ExitStack() as servers:
            base_url = (
                args.base_url or servers.enter_context(LaunchedTandem(args.output_dir / "launcher.log", [])).base_url
            )
            shape = _embedded_model_shape()
            roofline = measure_roofline(shape, ROOFLINE_BATCH)
            print(f"roofline: {roofline.to_dict()}", flush=True)
            static: list[tuple[str, StaticBatchResult]] = []
            tandems, peers, precisions = _start_servers(args, servers, base_url)
            for run in STANDARD_SUITE:
                static_dtypes = args.static_dtypes if run.static and not args.no_static else ()
                records, baselines = measure_workload(run, tandems, peers, static_dtypes, show=show)
                static += [(run.workload, baseline) for baseline in baselines]
                measured += [
                    MeasuredRow(run.workload, record, records[0], precisions[record.server]) for record in records
                ]
        if args.base_url is None:
            measured += _cache_off_rows(args.output_dir, measured, show)
    except RuntimeError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    _write_outputs(args, when, load_before, measured, static, roofline, shape)
    return 1 if any(row.record.summary.failed for row in measured) else 0


def measure_workload(
    run: SuiteRun, tandems: list[Endpoint], peers: list[Endpoint], static_dtypes: tuple[str, ...], show: bool
) -> tuple[list[RunRecord], list[StaticBatchResult]]:
    """Every endpoint's run of the workload, Tandem's first. The `transformers` baseline in each of `static_dtypes`
    runs right before and right after the Tandem runs (before the peers'), so the machine's drift during the peers'
    runs cannot reach the ratios against it."""
    if not static_dtypes:
        return run_row(run, [*tandems, *peers], show_progress=show), []
    before = [_static_baseline(run, dtype) for dtype in static_dtypes]
    records = run_row(run, tandems, show_progress=show)
    baselines = [StaticBatchResult.mean([first, _static_baseline(run, first.dtype)]) for first in before]
    if peers:
        records += run_row(run, peers, show_progress=show)
    return records, baselines


def _static_baseline(run: SuiteRun, dtype: str) -> StaticBatchResult:
    d, concurrency = run.dataset, run.point.concurrency
    if concurrency is None:
        raise ValueError(f"invariant: {run.workload} runs the static baseline, which needs a concurrency")
    result = run_transformers_static(concurrency, d.input_len, d.output_len, dtype)
    print(f"transformers static batch: {result}", flush=True)
    return result


def _start_servers(
    args: argparse.Namespace, servers: ExitStack, base_url: str
) -> tuple[list[Endpoint], list[Endpoint], dict[str, str | None]]:
    """The Tandems (the one at `base_url`, then the variants), the peers (running ones, llama-server), and the
    precision each multiplies in (None where no roofline figure fits)."""
    tandems = [Endpoint(name="tandem", base_url=base_url)]
    precisions: dict[str, str | None] = {"tandem": _precision([]) if args.base_url is None else None}
    for variant in args.tandem_variant:
        label, _, extra = variant.partition("=")
        log = args.output_dir / f"launcher-{label}.log"
        launched = servers.enter_context(LaunchedTandem(log, shlex.split(extra)))
        tandems.append(Endpoint(name=f"tandem {label} ({extra})", base_url=launched.base_url))
        precisions[tandems[-1].name] = _precision(shlex.split(extra))
    peers, peer_precisions = _start_peers(args, servers)
    with_body = [replace(tandem, extra_body=EXTRA_BODY) for tandem in tandems]
    return with_body, [replace(peer, extra_body=EXTRA_BODY) for peer in peers], precisions | peer_precisions


def _start_peers(args: argparse.Namespace, servers: ExitStack) -> tuple[list[Endpoint], dict[str, str | None]]:
    """The servers measured beside the Tandems: running ones given with --compare, and llama-server when asked."""
    peers = [Endpoint(name=name, base_url=url) for name, url in map(parse_server, args.compare)]
    precisions: dict[str, str | None] = {peer.name: None for peer in peers}
    if args.llama_server is not None:
        extra_args = tuple(shlex.split(args.llama_server_args))
        llama_config = LlamaServerConfig(args.llama_server, _embedded_gguf_path(), extra_args=extra_args)
        llama = servers.enter_context(LaunchedLlamaServer(llama_config, args.output_dir / "llama-server.log"))
        peers.append(Endpoint(name="llama-server", base_url=llama.base_url))
        precisions["llama-server"] = None
    return peers, precisions


def _precision(launcher_args: list[str]) -> str | None:
    """The precision a Tandem serving the embedded model with these arguments multiplies in on this CPU; None for
    quantized weights, whose kernels have no roofline figure (the embedded model is a GGUF, so `--quantize auto`
    serves its quantized blocks)."""
    if _flag_value(launcher_args, "--quantize", "auto") != "none":
        return None
    dtype = _flag_value(launcher_args, "--dtype", "auto")
    if dtype == "auto":
        # The shard's own choice (weight_defaults.py).
        return "bfloat16" if cpu_multiplies_bfloat16() else "float32"
    return {"float32": "float32", "bfloat16": "bfloat16"}.get(dtype)


def _flag_value(launcher_args: list[str], flag: str, default: str) -> str:
    return launcher_args[launcher_args.index(flag) + 1] if flag in launcher_args else default


def _cache_off_rows(output_dir: Path, measured: list[MeasuredRow], show: bool) -> list[MeasuredRow]:
    """The cache-off workloads on a second Tandem with --prefix-caching false, against the cache-on Tandem's run."""
    rows = []
    with LaunchedTandem(output_dir / "launcher-cache-off.log", CACHE_OFF_ARGS) as tandem:
        endpoint = Endpoint(name="tandem, prefix cache off", base_url=tandem.base_url, extra_body=EXTRA_BODY)
        for run in (run for run in STANDARD_SUITE if run.cache_off):
            baseline = next(row.baseline for row in measured if row.workload == run.workload)
            (record,) = run_row(run, [endpoint], show_progress=show)
            rows.append(MeasuredRow(run.workload, record, baseline, _precision(CACHE_OFF_ARGS)))
    return rows


def _write_outputs(
    args: argparse.Namespace,
    when: datetime,
    load_before: str,
    measured: list[MeasuredRow],
    static: list[tuple[str, StaticBatchResult]],
    roofline: Roofline,
    shape: TransformerShape,
) -> None:
    """README block, results.json (every request's timings) and the plots."""
    order = [run.workload for run in STANDARD_SUITE]
    measured = sorted(measured, key=lambda row: order.index(row.workload))
    servers = sorted({row.record.server for row in measured}, key=[row.record.server for row in measured].index)
    tandem = f"the Tandem at {args.base_url}" if args.base_url else "Tandem started by the launcher with its defaults"
    intro = (
        f"Measured {when:%Y-%m-%d %H:%M} UTC with `{SUITE_COMMAND}` on {os.cpu_count()} CPU cores (load average "
        f"{load_before} before, {_load_average()} after): {tandem}, servers {', '.join(servers)}; model "
        f"`{measured[0].record.model}`. Closed loop, streamed `/v1/completions`, `ignore_eos` so every request "
        'generates its full output; latencies in milliseconds; "vs Tandem" is output throughput against Tandem\'s run '
        "of the same workload in this invocation."
    )
    commands = [equivalent_command(run) for run in STANDARD_SUITE]
    block = readme_block(intro, measured, static, roofline, shape, commands)
    block += f"\n\n![Output tokens/s of every server on every workload]({SUITE_CHART})"
    print(block)
    runs = []
    for row in measured:
        run = next(run for run in STANDARD_SUITE if run.workload == row.workload)
        runs.append({**row.record.to_dict(), "workload": row.workload, "dataset": asdict(run.dataset)})
    document = {
        "date": when.isoformat(timespec="seconds"),
        "command": SUITE_COMMAND,
        "roofline": roofline.to_dict(),
        "transformers_static": [{"workload": workload, **asdict(result)} for workload, result in static],
        "runs": runs,
    }
    write_results(args.output_dir / "results.json", document)
    bars = [(row.workload, row.record.server, row.record.summary.output_throughput) for row in measured]
    bars += [
        (workload, f"transformers static batch, {result.dtype}", result.output_throughput)
        for workload, result in static
    ]
    # The bar chart sits beside the README it illustrates; the other plots go to the output directory.
    chart = args.readme.parent / SUITE_CHART
    chart.parent.mkdir(parents=True, exist_ok=True)
    plot_suite(bars, chart)
    labelled = [replace(row.record, server=f"{row.record.server}: {row.workload}") for row in measured]
    write_plots(labelled, args.output_dir)
    args.readme.write_text(replace_between_markers(args.readme.read_text(encoding="utf-8"), block), encoding="utf-8")
    print(f"results and plots: {args.output_dir}; table written to {args.readme}")


if __name__ == "__main__":
    raise SystemExit(main())
