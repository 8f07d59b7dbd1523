"""`tandem-bench speculative`: single-stream greedy output speed with `--speculate K` against the same server without,
on input-grounded text, free text and a repeated request, measured in turns on two servers started side by side.

Every round asks a new grounded text and a new story, so only the request's own context can predict them; the
repeated workload asks the same long context every round, as a client retrying or an agent re-asking does."""

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


STORY_SUBJECTS = (
    "a lighthouse keeper who finds a message in a bottle",
    "a baker whose bread predicts the weather",
    "two rival clockmakers on the same street",
    "a cartographer who maps a city that keeps moving",
    "a retired astronaut learning to sail",
    "a librarian who catalogues forgotten dreams",
    "a beekeeper negotiating with a storm",
    "a violin that remembers every player",
)


@dataclass(frozen=True)
class Workload:
    name: str
    # Round i asks prompts[i % len(prompts)].
    prompts: tuple[str, ...]


def _text(words: int, offset: int) -> str:
    return " ".join(WORDS[(7 * i + offset) % len(WORDS)] for i in range(words))


def workloads(words: int, rounds: int) -> list[Workload]:
    """A new text to copy each round (prompt lookup drafts it), a new story each round (nothing to copy), and one
    long context asked every round (only what the same request generated before predicts its answer)."""
    grounded = []
    for round_index in range(rounds + 1):
        text = _text(words, 13 * round_index)
        grounded.append(f"Copy the text below exactly.\nText: {text}\nCopy: {text[:80]}")
    stories = [f"Write a short story about {STORY_SUBJECTS[i % len(STORY_SUBJECTS)]}.\n" for i in range(rounds + 1)]
    context = _text(words * 2, 5)
    repeated = f"Notes: {context}\nQuestion: Write a short story that uses the notes above.\nStory:"
    return [Workload("grounded", tuple(grounded)), Workload("free", tuple(stories)), Workload("repeated", (repeated,))]


def _generate(server: LaunchedTandem, model: str, prompt: str, output_len: int, timing: Timing) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0}
    return timed_completion(server, body, timing)


def measure(plain: LaunchedTandem, drafting: LaunchedTandem, args: argparse.Namespace) -> list[str]:
    """One table row per workload; the two servers take turns within each round."""
    model = served_model(plain.base_url)
    rows = []
    for workload in workloads(args.words, args.rounds):
        off, on = Timing(), Timing()
        before = {name: metric_total(drafting.base_url, name) for name in (ACCEPTED, DRAFTED)}
        identical = True
        # One unmeasured request each warms the prefix cache and the allocator alike.
        for round_index in range(args.rounds + 1):
            scratch = Timing()
            prompt = workload.prompts[round_index % len(workload.prompts)]
            text_off = _generate(plain, model, prompt, args.output_len, off if round_index else scratch)
            text_on = _generate(drafting, model, prompt, args.output_len, on if round_index else scratch)
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
    parser.add_argument(
        "--method", choices=("ngram", "radix"), default="ngram", help="--speculative-method of the drafting server"
    )
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
        LaunchedTandem(
            args.log_dir / "drafting.log",
            [*extra, "--speculate", str(args.speculate), "--speculative-method", args.method],
        ) as drafting,
    ):
        rows = measure(plain, drafting, args)
    print(
        f"single stream, greedy, {args.output_len} tokens, {args.rounds} rounds, --speculate {args.speculate} "
        f"--speculative-method {args.method}"
    )
    print("| workload | tok/s off | tok/s on | ratio | drafts kept | same text |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
