"""`make bench`: starts Tandem on a free port, runs the standard suite and rewrites the README's benchmark table."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import textwrap
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from tandem_bench.client import Endpoint
from tandem_bench.datasets import DatasetConfig
from tandem_bench.load import LoadPoint
from tandem_bench.plots import write_plots
from tandem_bench.readme import replace_between_markers
from tandem_bench.report import format_run
from tandem_bench.results import results_document, write_results
from tandem_bench.runner import BenchConfig, RunRecord, run_benchmark_sync
from tandem_bench.server_process import LaunchedTandem

# Every request generates exactly its output length, so runs on different servers do the same work.
EXTRA_BODY = {"ignore_eos": True}
SUITE_COMMAND = "make bench"


@dataclass(frozen=True)
class SuiteRun:
    """One row of the README table."""

    workload: str
    dataset: DatasetConfig
    point: LoadPoint


def _fixed(num_prompts: int, seed: int) -> DatasetConfig:
    return DatasetConfig(kind="fixed", num_prompts=num_prompts, input_len=64, output_len=64, seed=seed)


# Every row has its own seed: no row may reuse prompts (and so cached prefixes) of an earlier one.
STANDARD_SUITE: tuple[SuiteRun, ...] = (
    SuiteRun("64 in / 64 out", _fixed(4, seed=1), LoadPoint(concurrency=1)),
    SuiteRun("64 in / 64 out", _fixed(8, seed=2), LoadPoint(concurrency=4)),
    SuiteRun("64 in / 64 out", _fixed(32, seed=3), LoadPoint(concurrency=16)),
    SuiteRun(
        "shared prefix 256 + 32 in / 32 out",
        DatasetConfig(
            kind="shared-prefix", num_prompts=16, prefix_len=256, num_prefixes=2, input_len=32, output_len=32, seed=4
        ),
        LoadPoint(concurrency=4),
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


def readme_block(runs: tuple[SuiteRun, ...], records: list[RunRecord], when: datetime, context: str) -> str:
    """The README section: how it was measured (`context`: server and machine load), the table, each row's command."""
    model = records[0].model if records else "?"
    intro = (
        f"Measured {when:%Y-%m-%d %H:%M} UTC with `{SUITE_COMMAND}` on {context}, model `{model}`, "
        f"{os.cpu_count()} CPU cores. Other work may have shared the "
        "machine; treat the figures as indicative. Closed loop, streamed `/v1/completions`, `ignore_eos` so every "
        "request generates its full output; latencies in milliseconds."
    )
    lines = [
        *textwrap.wrap(intro, width=120),
        "",
        "| workload | concurrency | ok/failed | req/s | output tok/s | total tok/s | TTFT median / p99 "
        "| TPOT median | ITL median / p99 | E2E median |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, record in zip(runs, records, strict=True):
        s = record.summary
        lines.append(
            f"| {run.workload} | {run.point.concurrency} | {s.completed}/{s.failed} | {s.request_throughput:.2f} "
            f"| {s.output_throughput:.1f} | {s.total_token_throughput:.1f} | {s.ttft.median:.0f} / {s.ttft.p99:.0f} "
            f"| {s.tpot.median:.1f} | {s.itl.median:.1f} / {s.itl.p99:.1f} | {s.e2e.median:.0f} |"
        )
    lines += ["", "Each row on its own, against a running server:", "", "```sh"]
    lines += [equivalent_command(run) for run in runs]
    lines.append("```")
    return "\n".join(lines)


def run_suite(
    base_url: str, runs: tuple[SuiteRun, ...], show_progress: bool
) -> tuple[list[BenchConfig], list[RunRecord]]:
    """Runs each suite row in order; only the first warms the server up."""
    endpoint = Endpoint(name="tandem", base_url=base_url, extra_body=EXTRA_BODY)
    configs: list[BenchConfig] = []
    records: list[RunRecord] = []
    for index, run in enumerate(runs):
        config = BenchConfig(
            endpoints=[endpoint],
            points=[run.point],
            dataset=run.dataset,
            warmup_requests=1 if index == 0 else 0,
            show_progress=show_progress,
        )
        (record,) = run_benchmark_sync(config)
        print(format_run(record), flush=True)
        configs.append(config)
        records.append(replace(record, server=f"tandem {run.workload}"))
    return configs, records


def _load_average() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Starts Tandem (unless --base-url is given), runs the suite, writes results and the README table."""
    parser = argparse.ArgumentParser(prog="python -m tandem_bench.suite", description=__doc__)
    parser.add_argument("--base-url", default=None, help="measure this running server instead of starting one")
    parser.add_argument("--readme", type=Path, default=Path("README.md"), help="README to rewrite")
    parser.add_argument("--output-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    load_before = _load_average()
    try:
        if args.base_url:
            configs, records = run_suite(args.base_url, STANDARD_SUITE, not args.no_progress)
        else:
            with LaunchedTandem(args.output_dir / "launcher.log") as tandem:
                print(f"Tandem is up at {tandem.base_url}", flush=True)
                configs, records = run_suite(tandem.base_url, STANDARD_SUITE, not args.no_progress)
    except RuntimeError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    server = f"the server at {args.base_url}" if args.base_url else "Tandem started by the launcher with its defaults"
    context = f"{server} (load average {load_before} before, {_load_average()} after)"
    block = readme_block(STANDARD_SUITE, records, when, context)
    print(block)
    document = results_document(configs[0], records, SUITE_COMMAND)
    del document["dataset"]  # each suite row has its own workload, recorded with its run
    document["runs"] = [
        {**record.to_dict(), "dataset": asdict(config.dataset)} for config, record in zip(configs, records, strict=True)
    ]
    write_results(args.output_dir / "results.json", document)
    write_plots(records, args.output_dir)
    args.readme.write_text(replace_between_markers(args.readme.read_text(encoding="utf-8"), block), encoding="utf-8")
    print(f"results and plots: {args.output_dir}; table written to {args.readme}")
    return 1 if any(record.summary.failed for record in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
