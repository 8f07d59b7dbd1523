"""`make gpu-check`: CUDA tests, the real stack answering a chat request, and a throughput sweep with MFU.

Runs on one CUDA machine from the working tree (see scripts/gpu_check.sh, which prepares the environment):
  1. the CUDA numerics and attention-backend tests (bfloat16, tolerances stated in the test files), the MLA decode
     kernel against the eager absorbed form and a small DeepSeek-V3 on the triton backend against transformers;
  2. launcher -> router -> shard on cuda:0 serving a random-weight Llama-3-8B-shaped model, answering a chat;
  3. a closed-loop sweep with tandem-bench's runner: throughput, TTFT/ITL percentiles, prefill and decode MFU;
  4. FP8: each GEMM of the model in float8 against bfloat16 (fp8_check), then the stack with `--quantize fp8`
     (triton) at batch 1 (latency) and 256 (throughput).
Phases 2 and 3 run once per attention backend of --attention-backends (triton, then flash) and once more for FP8,
each on its own share of the time budget.
Prints every result and writes them as JSON; exits non-zero when any phase fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tandem_bench.client import Endpoint
from tandem_bench.datasets import DatasetConfig, random_text
from tandem_bench.fp8_check import LLAMA3_8B_GEMMS, fp8_against_bf16, fp8_gemm_errors
from tandem_bench.gpu_report import SweepRow, format_sweep, prefill_mfu, sweep_row
from tandem_bench.load import LoadPoint
from tandem_bench.mfu import TransformerShape, bf16_peak_flops
from tandem_bench.prometheus import histogram_delta, parse_samples
from tandem_bench.random_model import llama3_8b_config, write_padded_tokenizer, write_random_checkpoint
from tandem_bench.runner import BenchConfig, run_benchmark_sync
from tandem_bench.server_process import LaunchedTandem, free_port

REPO = Path(__file__).resolve().parents[2]
CUDA_TESTS = [
    "server/tests/test_cuda_numerics.py",
    "server/tests/triton_cases.py",
    "server/tests/int4_triton_cases.py",
    "server/tests/moe_triton_cases.py",
    "server/tests/latent_triton_cases.py",
    "server/tests/recurrent_kernel_cases.py",
    "server/tests/lora_triton_cases.py",
    "server/tests/test_attention_backends.py",
    "server/tests/test_attention_selection.py",
    "server/tests/test_cuda_path_logic.py",
    "server/tests/test_flash_backend.py",
]
ATTENTION_BACKENDS = ("triton", "flash")
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The FP8 row: batch-1 latency and batch-256 throughput, served with the triton backend.
FP8_SWEEP = (1, 256)
FP8_BACKEND = "triton"
GRAPH_SIZES = "1,2,4,8,16,32,64,128,256"
PREFILL_BURST = 64
FORWARD_METRIC = "tandem_shard_forward_duration_seconds"
# The model's idle time between two forward passes, recorded for steps sent while the router had work.
GAP_METRIC = "tandem_step_forward_gap_seconds"


@dataclass
class CheckReport:
    """Everything the check measured, in the order it ran."""

    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def record(self, phase: str, ok: bool, **details: Any) -> None:
        self.phases[phase] = {"ok": ok, **details}
        if not ok:
            self.failed.append(phase)
        print(f"[gpu-check] {phase}: {'ok' if ok else 'FAILED'} {json.dumps(details, default=str)[:2000]}", flush=True)


def run_cuda_tests(report: CheckReport, timeout_s: float) -> None:
    """Phase 1: pytest over the CUDA and attention test files, output streamed to the console."""
    started = time.monotonic()
    # triton_cases.py, int4_triton_cases.py, moe_triton_cases.py, latent_triton_cases.py, recurrent_kernel_cases.py and
    # lora_triton_cases.py run their kernels on the GPU itself, so their CPU-interpreter twins are left out here.
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "not under_the_interpreter"]
    command += CUDA_TESTS
    try:
        returncode = subprocess.run(command, cwd=REPO, timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
        # The later phases need no test result: a slow test run fails this phase only.
        report.record("cuda_tests", False, error=f"timed out after {timeout_s:.0f} s")
        return
    report.record("cuda_tests", returncode == 0, seconds=round(time.monotonic() - started, 1))


def build_model(work_dir: Path, tokenizer_dir: Path, report: CheckReport) -> Path:
    """A random-weight Llama-3-8B-shaped checkpoint on cuda:0 with a tokenizer padded to its vocabulary."""
    started = time.monotonic()
    model_dir = work_dir / "llama3-8b-random"
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text())
    config = llama3_8b_config(eos_token_id=generation["eos_token_id"], bos_token_id=generation["bos_token_id"])
    write_padded_tokenizer(tokenizer_dir, model_dir, config["vocab_size"])
    written = write_random_checkpoint(model_dir, config, "cuda")
    report.record("build_model", True, bytes=written, seconds=round(time.monotonic() - started, 1))
    return model_dir


def words_for_tokens(model_dir: Path, target_tokens: int) -> int:
    """Random-word prompt length that tokenizes to about `target_tokens` with this model's tokenizer."""
    import random  # noqa: PLC0415

    from tokenizers import Tokenizer  # noqa: PLC0415

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sample = random_text(random.Random(0), 2000)
    tokens_per_word = len(tokenizer.encode(sample, add_special_tokens=False).ids) / 2000
    return max(1, round(target_tokens / tokens_per_word))


def post_json(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def check_chat(base_url: str, log_path: Path, report: CheckReport, phase: str = "chat_request") -> None:
    """Phase 2: one chat completion through the whole stack, with /info and the shard's start-up choices."""
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16, "ignore_eos": True}
    answer = post_json(f"{base_url}/v1/chat/completions", body)
    with urllib.request.urlopen(f"{base_url}/info", timeout=30) as response:
        info = json.loads(response.read())
    content = answer["choices"][0]["message"]["content"]
    ok = bool(content) and answer["usage"]["completion_tokens"] == 16
    choices = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if _is_choice(line)]
    report.record(phase, ok, completion_tokens=answer["usage"]["completion_tokens"], info=info, shard_choices=choices)


def _is_choice(log_line: str) -> bool:
    # The shard logs its attention backend, graph capture, KV capacity and weight formats once at start-up.
    return any(marker in log_line for marker in ("attention backend", "CUDA graphs", "KV cache", "weights take"))


def scrape(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        return parse_samples(response.read().decode())


def run_point(endpoint: Endpoint, concurrency: int, dataset: DatasetConfig) -> Any:
    # The chat check warmed the stack up; no unmeasured request may land between two metric scrapes.
    point = LoadPoint(concurrency=concurrency)
    config = BenchConfig([endpoint], [point], dataset, warmup_requests=0, show_progress=False)
    return run_benchmark_sync(config)[0]


def measure_prefill(endpoint: Endpoint, metrics_url: str, words: int, shape: TransformerShape, peak: float) -> float:
    """Prefill MFU from a burst of 1-token requests: every step is prefill-only, timed by the shard itself."""
    before = scrape(metrics_url)
    dataset = DatasetConfig(kind="random", num_prompts=PREFILL_BURST, input_len=words, output_len=1, seed=7)
    record = run_point(endpoint, PREFILL_BURST, dataset)
    forward = histogram_delta(before, scrape(metrics_url), FORWARD_METRIC)
    prompts = [r.prompt_tokens or r.prompt_words for r in record.requests if r.success]
    return prefill_mfu(shape, prompts, forward.total, peak)


def run_sweep(base_url: str, metrics_url: str, model_dir: Path, args: argparse.Namespace, report: CheckReport) -> None:
    """Phase 3: batch sweep, stopping early (and saying so) when the time budget runs out."""
    import torch  # noqa: PLC0415

    device_name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else bf16_peak_flops(device_name)
    if peak is None:
        report.record("throughput", False, error=f"no bf16 peak known for {device_name}; pass --peak-tflops")
        return
    shape = TransformerShape.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    words = words_for_tokens(model_dir, args.prompt_tokens)
    endpoint = Endpoint(name="tandem", base_url=base_url, extra_body={"ignore_eos": True})
    prefill = measure_prefill(endpoint, metrics_url, words, shape, peak)
    rows: list[SweepRow] = []
    skipped = []
    for concurrency in args.points:
        if time.monotonic() > args.backend_deadline:
            skipped.append(concurrency)
            continue
        dataset = DatasetConfig(
            kind="random", num_prompts=max(4, 2 * concurrency), input_len=words, output_len=args.output_len
        )
        before = scrape(metrics_url)
        record = run_point(endpoint, concurrency, dataset)
        after = scrape(metrics_url)
        forward, gap = histogram_delta(before, after, FORWARD_METRIC), histogram_delta(before, after, GAP_METRIC)
        row = sweep_row(concurrency, record.summary, shape, args.output_len, peak)
        rows.append(replace(row, forward_ms=forward.mean * 1000.0, forward_gap_ms=gap.mean * 1000.0))
        print(format_sweep(rows[-1:]), flush=True)
    print(f"{device_name}, bf16 peak {peak / 1e12:.0f} TFLOP/s, prefill MFU {prefill:.1%}\n{format_sweep(rows)}")
    ok = bool(rows) and all(row.failed == 0 for row in rows) and not skipped
    report.record(
        f"throughput/{args.run}",
        ok,
        device=device_name,
        prefill_mfu=prefill,
        rows=[r.to_dict() for r in rows],
        skipped=skipped,
    )


def serve_runs(args: argparse.Namespace) -> list[tuple[str, str, tuple[int, ...]]]:
    """(attention backend, --quantize, batch sizes) of each launch: every backend on bfloat16, then FP8."""
    runs = [(backend, "none", tuple(args.sweep)) for backend in args.attention_backends]
    return [*runs, (FP8_BACKEND, "fp8", FP8_SWEEP)] if args.fp8 else runs


def serve_and_measure(model_dir: Path, args: argparse.Namespace, report: CheckReport) -> None:
    """Phases 2 and 3 against one launch of the real stack per run, each within its budget share."""
    runs = serve_runs(args)
    for index, (backend, quantize, points) in enumerate(runs):
        remaining = args.deadline - time.monotonic()
        args.backend, args.quantize, args.points = backend, quantize, points
        args.run = backend if quantize == "none" else f"{backend}+{quantize}"
        args.backend_deadline = time.monotonic() + remaining / (len(runs) - index)
        log_path = args.work_dir / f"launcher-{args.run}.log"
        try:
            serve_with_backend(model_dir, log_path, args, report)
        except Exception as error:
            # One run's failure is reported; the next run still starts.
            report.record(f"serve/{args.run}", False, error=f"{type(error).__name__}: {error}")
            print_log_tail(log_path)


def check_fp8_numerics(report: CheckReport) -> None:
    """Phase 4a: every Llama-3-8B GEMM in float8 against bfloat16 on cuda:0, at batch 1 and 256 rows."""
    started = time.monotonic()
    try:
        errors = {rows: fp8_gemm_errors(LLAMA3_8B_GEMMS, rows, "cuda") for rows in FP8_SWEEP}
    except Exception as error:
        # A GPU or torch build without float8 GEMMs fails this phase; the bfloat16 runs still measure.
        report.record("fp8_numerics", False, error=f"{type(error).__name__}: {error}")
        return
    ok = all(error["ok"] for by_role in errors.values() for error in by_role.values())
    report.record("fp8_numerics", ok, errors=errors, seconds=round(time.monotonic() - started, 1))


def serve_with_backend(model_dir: Path, log_path: Path, args: argparse.Namespace, report: CheckReport) -> None:
    metrics_port = free_port()
    launcher_args = [
        "--model-id", str(model_dir), "--device", "cuda", "--num-shard", "1", "--dtype", "bfloat16",
        "--max-batch-size", "256", "--max-concurrent-requests", "1024", "--max-batch-prefill-tokens", "8192",
        "--max-total-tokens", "2048", "--cuda-graphs", GRAPH_SIZES, "--shard-metrics-port", str(metrics_port),
        "--attention-backend", args.backend, "--quantize", args.quantize,
    ]  # fmt: skip
    started = time.monotonic()
    with LaunchedTandem(log_path, launcher_args) as tandem:
        report.record(f"stack_ready/{args.run}", True, seconds=round(time.monotonic() - started, 1))
        check_chat(tandem.base_url, tandem.log_path, report, f"chat_request/{args.run}")
        run_sweep(tandem.base_url, f"http://127.0.0.1:{metrics_port}/metrics", model_dir, args, report)


def print_log_tail(log_path: Path, lines: int = 80) -> None:
    if log_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
        print(f"[gpu-check] last {len(tail)} lines of {log_path}:", *tail, sep="\n", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem-gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/tandem-gpu-check"))
    parser.add_argument("--tokenizer-dir", type=Path, default=REPO / ".gpu-check" / "tokenizer")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--sweep", type=int, nargs="+", default=list(SWEEP))
    parser.add_argument("--budget-s", type=float, default=520.0, help="stop starting sweep points after this")
    parser.add_argument("--tests-timeout-s", type=float, default=180.0)
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak when the GPU is not known")
    parser.add_argument("--attention-backends", nargs="+", choices=ATTENTION_BACKENDS, default=list(ATTENTION_BACKENDS))
    parser.add_argument("--no-fp8", dest="fp8", action="store_false", help="skip the FP8 numerics and launch")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.deadline = time.monotonic() + args.budget_s
    args.work_dir.mkdir(parents=True, exist_ok=True)
    report = CheckReport()
    try:
        run_cuda_tests(report, args.tests_timeout_s)
        if args.fp8:
            check_fp8_numerics(report)
        model_dir = build_model(args.work_dir, args.tokenizer_dir, report)
        serve_and_measure(model_dir, args, report)
        if args.fp8 and FP8_BACKEND in args.attention_backends:
            compared = fp8_against_bf16(report.phases, FP8_BACKEND, f"{FP8_BACKEND}+fp8")
            report.record("fp8_against_bf16", bool(compared), **compared)
    except Exception as error:
        # Every failure is reported, then the check fails.
        report.record("aborted", False, error=f"{type(error).__name__}: {error}")
    (args.work_dir / "gpu-check.json").write_text(json.dumps(report.phases, indent=2, default=str) + "\n")
    print(f"[gpu-check] results: {args.work_dir / 'gpu-check.json'}; failed: {report.failed or 'none'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
