"""`tandem-bench quantized`: the embedded GGUF served with float32 weights and with its own Q4_1/Q8_0 blocks
(`--quantize gguf`), side by side: single-stream and concurrent output speed in turns, and greedy agreement."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import Timing, completion_tokens, post_completion, served_model, timed_completion
from tandem_bench.words import WORDS

COMMAND = "tandem-bench quantized"
BASELINE = "float32"
HELD_OUT_PROMPTS = (
    "The three primary colours are",
    "Write one sentence about the sea:",
    "def fibonacci(n):",
    "The capital of France is",
    "List three uses of copper:",
    "Once upon a time, in a small village,",
    "Explain photosynthesis to a child:",
    "import numpy as np\n",
)


def _variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, launcher flags): float32 first (the baseline), then gguf, then the user's."""
    extra = shlex.split(args.launcher_args)
    variants = [(BASELINE, extra), ("gguf", [*extra, "--quantize", "gguf"])]
    for spec in args.variant:
        name, _, flags = spec.partition("=")
        variants.append((name, [*extra, *shlex.split(flags)]))
    return variants


def _prompt(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 31 + 7 * i) % len(WORDS)] for i in range(words))


def _single_stream(servers: dict[str, LaunchedTandem], model: str, args: argparse.Namespace) -> dict[str, float]:
    timings = {name: Timing() for name in servers}
    body = {"model": model, "prompt": _prompt(50, 1), "max_tokens": args.output_len, "temperature": 0.0}
    body["ignore_eos"] = True
    for round_index in range(args.rounds + 1):  # round 0 warms every server up unmeasured
        for name, server in servers.items():
            timed_completion(server, body, timings[name] if round_index else Timing())
    return {name: timing.tokens_per_second for name, timing in timings.items()}


def _concurrent(servers: dict[str, LaunchedTandem], model: str, args: argparse.Namespace) -> dict[str, float]:
    """Output tokens per second of `args.streams` requests sent at once, each server in turn."""
    rates = {}
    for name, server in servers.items():
        bodies = [
            {"model": model, "prompt": _prompt(50, seed), "max_tokens": args.output_len // 2, "ignore_eos": True}
            for seed in range(args.streams)
        ]
        started = time.perf_counter()
        with ThreadPoolExecutor(args.streams) as pool:
            answers = list(pool.map(post_completion, [server.base_url] * len(bodies), bodies))
        tokens = sum(completion_tokens(answer) for answer in answers)
        rates[name] = tokens / (time.perf_counter() - started)
    return rates


def _agreement(servers: dict[str, LaunchedTandem], model: str, tokens: int) -> dict[str, tuple[int, int]]:
    """Per server: (greedy tokens equal to float32's before the first difference, tokens compared)."""
    texts: dict[str, list[list[str]]] = {name: [] for name in servers}
    for name, server in servers.items():
        for prompt in HELD_OUT_PROMPTS:
            body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "logprobs": 1}
            answer = post_completion(server.base_url, body)
            texts[name].append(answer["choices"][0]["logprobs"]["tokens"])  # type: ignore[index]
    baseline = texts[BASELINE]
    result = {}
    for name, outputs in texts.items():
        agreed = 0
        for want, got in zip(baseline, outputs, strict=True):
            agreed += next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got))
            )
        result[name] = (agreed, sum(len(want) for want in baseline))
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="measured single-stream requests per server")
    parser.add_argument(
        "--output-len", type=int, default=128, help="tokens per single-stream request (half that per concurrent one)"
    )
    parser.add_argument("--streams", type=int, default=32, help="concurrent requests of the concurrent workload")
    parser.add_argument("--agreement-tokens", type=int, default=32, help="greedy tokens per held-out prompt")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags for every server (one string)")
    parser.add_argument(
        "--variant", action="append", default=[], help="another server, as 'name=launcher flags' (repeatable)"
    )
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "quantized")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    variants = _variants(args)
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(LaunchedTandem(args.log_dir / f"{name}.log", flags)) for name, flags in variants
        }
        model = served_model(servers[BASELINE].base_url)
        single = _single_stream(servers, model, args)
        concurrent = _concurrent(servers, model, args)
        agreement = _agreement(servers, model, args.agreement_tokens)
    print(
        f"greedy, ignore_eos; single stream {args.output_len} tokens x {args.rounds} rounds in turns; "
        f"{args.streams} concurrent streams of {args.output_len // 2} tokens"
    )
    print("| server | flags | single stream tok/s | vs float32 | concurrent tok/s | vs float32 | greedy agreement |")
    print("|---|---|---|---|---|---|---|")
    for name, flags in variants:
        agreed, compared = agreement[name]
        print(
            f"| {name} | `{shlex.join(flags) or '(defaults)'}` | {single[name]:.1f} | "
            f"{single[name] / single[BASELINE]:.2f}x | {concurrent[name]:.1f} | "
            f"{concurrent[name] / concurrent[BASELINE]:.2f}x | {agreed}/{compared} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
