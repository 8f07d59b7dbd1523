"""`tandem-bench speculative`: single-stream greedy output speed with `--speculate K` against the same server without,
on input-grounded and on free text, measured in turns on two servers started side by side."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import Timing, metric_total, served_model, timed_completion
from tandem_bench.words import WORDS

COMMAND = "tandem-bench speculative"
ACCEPTED = "tandem_speculative_accepted_tokens_total"
DRAFTED = "tandem_speculative_draft_tokens_total"


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str


def workloads(words: int) -> list[Workload]:
    """A text to copy (input-grounded: prompt lookup drafts it) and a continuation with nothing to copy."""
    text = " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(words))
    return [
        Workload("grounded", f"Copy the text below exactly.\nText: {text}\nCopy: {text[:80]}"),
        Workload("free", "Write a short story about a lighthouse keeper who finds a message in a bottle.\n"),
    ]


def _generate(server: LaunchedTandem, model: str, workload: Workload, output_len: int, timing: Timing) -> str:
    body = {"model": model, "prompt": workload.prompt, "max_tokens": output_len, "temperature": 0.0}
    return timed_completion(server, body, timing)


def measure(plain: LaunchedTandem, drafting: LaunchedTandem, args: argparse.Namespace) -> list[str]:
    """One table row per workload; the two servers take turns within each round."""
    model = served_model(plain.base_url)
    rows = []
    for workload in workloads(args.words):
        off, on = Timing(), Timing()
        before = {name: metric_total(drafting.base_url, name) for name in (ACCEPTED, DRAFTED)}
        identical = True
        # One unmeasured request each warms the prefix cache and the allocator alike.
        for round_index in range(args.rounds + 1):
            scratch = Timing()
            text_off = _generate(plain, model, workload, args.output_len, off if round_index else scratch)
            text_on = _generate(drafting, model, workload, args.output_len, on if round_index else scratch)
            identical = identical and text_off == text_on
        accepted = metric_total(drafting.base_url, ACCEPTED) - before[ACCEPTED]
        drafted = metric_total(drafting.base_url, DRAFTED) - before[DRAFTED]
        rate = accepted / drafted if drafted else 0.0
        ratio = on.tokens_per_second / off.tokens_per_second if off.tokens_per_second else 0.0
        rows.append(
            f"| {workload.name} | {off.tokens_per_second:.1f} | {on.tokens_per_second:.1f} | {ratio:.2f}x "
            f"| {rate:.0%} | {'yes' if identical else 'NO'} |"
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--speculate", type=int, default=4, help="draft tokens per decode step on the drafting server")
    parser.add_argument("--rounds", type=int, default=3, help="measured requests per workload and server")
    parser.add_argument("--output-len", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--words", type=int, default=120, help="words of the text the grounded prompt copies")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags for both servers (one string)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "speculative")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    extra = shlex.split(args.launcher_args)
    with (
        LaunchedTandem(args.log_dir / "plain.log", extra) as plain,
        LaunchedTandem(args.log_dir / "drafting.log", [*extra, "--speculate", str(args.speculate)]) as drafting,
    ):
        rows = measure(plain, drafting, args)
    print(f"single stream, greedy, {args.output_len} tokens, {args.rounds} rounds, --speculate {args.speculate}")
    print("| workload | tok/s off | tok/s on | ratio | drafts kept | same text |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
