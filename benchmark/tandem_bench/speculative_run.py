"""`tandem-bench speculative`: greedy output speed with `--speculate K` against the same server without, on
input-grounded text, free text and a repeated request, one stream or `--concurrency` at once, measured in turns on two
servers started side by side.

Every round asks a new grounded text and a new story, so only the request's own context can predict them; the
repeated workload asks the same long context every round, as a client retrying or an agent re-asking does."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tandem_bench.draft_checkpoint import write_truncated_checkpoint
from tandem_bench.peers import LaunchedLlamaServer, LlamaServerConfig
from tandem_bench.server_process import LaunchedServer, LaunchedTandem
from tandem_bench.side_by_side import Timing, metric_total, served_model, timed_completions
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
    # Round i's streams ask the next prompts in turn, from the start again after the last.
    prompts: tuple[str, ...]


def _text(words: int, offset: int) -> str:
    return " ".join(WORDS[(7 * i + offset) % len(WORDS)] for i in range(words))


def workloads(words: int, requests: int) -> list[Workload]:
    """`requests` new texts to copy (prompt lookup drafts them), as many new stories (nothing to copy), and one long
    context asked every time (only what the same request generated before predicts its answer)."""
    grounded = []
    for index in range(requests):
        text = _text(words, 13 * index)
        grounded.append(f"Copy the text below exactly.\nText: {text}\nCopy: {text[:80]}")
    stories = [
        f"Write a short story about {STORY_SUBJECTS[i % len(STORY_SUBJECTS)]}, part {i // len(STORY_SUBJECTS) + 1}.\n"
        for i in range(requests)
    ]
    context = _text(words * 2, 5)
    repeated = f"Notes: {context}\nQuestion: Write a short story that uses the notes above.\nStory:"
    return [Workload("grounded", tuple(grounded)), Workload("free", tuple(stories)), Workload("repeated", (repeated,))]


def _generate(server: LaunchedServer, model: str, prompts: list[str], output_len: int, timing: Timing) -> list[str]:
    bodies: list[dict[str, object]] = [
        {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0} for prompt in prompts
    ]
    return timed_completions(server, bodies, timing)


def measure(
    plain: LaunchedTandem,
    drafting: LaunchedTandem,
    peers: Sequence[tuple[str, LaunchedServer]],
    args: argparse.Namespace,
) -> list[str]:
    """One table row per workload; the servers take turns within each round, the peers after the two Tandems."""
    model = served_model(plain.base_url)
    rows = []
    streams = args.concurrency
    chosen = [workload for workload in workloads(args.words, (args.rounds + 1) * streams) if workload.name in args.only]
    for workload in chosen:
        off, on = Timing(), Timing()
        peer_timings = [Timing() for _ in peers]
        before = {name: metric_total(drafting.base_url, name) for name in (ACCEPTED, DRAFTED)}
        identical = True
        # One unmeasured request each warms the prefix cache and the allocator alike.
        for round_index in range(args.rounds + 1):
            scratch = Timing()
            first = round_index * streams
            prompts = [workload.prompts[(first + i) % len(workload.prompts)] for i in range(streams)]
            text_off = _generate(plain, model, prompts, args.output_len, off if round_index else scratch)
            text_on = _generate(drafting, model, prompts, args.output_len, on if round_index else scratch)
            identical = identical and text_off == text_on
            for (_, peer), timing in zip(peers, peer_timings, strict=True):
                _generate(peer, model, prompts, args.output_len, timing if round_index else scratch)
        accepted = metric_total(drafting.base_url, ACCEPTED) - before[ACCEPTED]
        drafted = metric_total(drafting.base_url, DRAFTED) - before[DRAFTED]
        rate = accepted / drafted if drafted else 0.0
        cells = [
            workload.name,
            f"{off.tokens_per_second:.1f}",
            f"{on.tokens_per_second:.1f}",
            f"{_ratio(on, off):.2f}x",
            f"{rate:.0%}",
            "yes" if identical else "NO",
        ]
        for timing in peer_timings:
            cells += [f"{timing.tokens_per_second:.1f}", f"{_ratio(on, timing):.2f}x"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _ratio(numerator: Timing, denominator: Timing) -> float:
    return numerator.tokens_per_second / denominator.tokens_per_second if denominator.tokens_per_second else 0.0


def _header(peer_names: list[str]) -> str:
    columns = ["workload", "tok/s off", "tok/s on", "ratio", "drafts kept", "same text"]
    for name in peer_names:
        columns += [f"{name} tok/s", f"on ÷ {name}"]
    return "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--speculate", type=int, default=4, help="draft tokens per decode step on the drafting server")
    parser.add_argument(
        "--method",
        choices=("ngram", "radix", "draft"),
        default="ngram",
        help="--speculative-method of the drafting server",
    )
    parser.add_argument(
        "--draft-model",
        type=Path,
        default=None,
        help="draft: the draft model's directory (default: the embedded model's converted directory, drafting for "
        "itself)",
    )
    parser.add_argument(
        "--draft-layers", type=int, default=0, help="draft: keep only the draft model's first N layers (0: all)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per workload and server")
    parser.add_argument("--concurrency", type=int, default=1, help="requests sent at once in each round")
    parser.add_argument(
        "--only", nargs="+", default=["grounded", "free", "repeated"], help="workloads to run (default: all three)"
    )
    parser.add_argument("--output-len", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--words", type=int, default=120, help="words of the text the grounded prompt copies")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags for both servers (one string)")
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="also time this llama-server binary on the embedded GGUF, without and with its own speculative decoding",
    )
    parser.add_argument("--llama-server-args", default="", help="more llama-server arguments for both of its runs")
    parser.add_argument(
        "--llama-spec-args",
        default="--spec-type ngram-simple --spec-draft-n-max 4",
        help="llama-server's speculative decoding arguments for its second run",
    )
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "speculative")
    return parser


def _draft_flags(args: argparse.Namespace) -> list[str]:
    """`--speculative-model` for the draft method: the given or embedded model, cut to `--draft-layers` if asked."""
    if args.method != "draft":
        return []
    source = args.draft_model or _embedded_model_dir()
    if args.draft_layers:
        target = args.log_dir / f"draft-{args.draft_layers}-layers"
        source = write_truncated_checkpoint(source, target, args.draft_layers)
    return ["--speculative-model", str(source)]


def _llama_servers(args: argparse.Namespace) -> list[tuple[str, LaunchedLlamaServer]]:
    """llama-server on the embedded GGUF with one slot per stream, without and with its speculative decoding."""
    if args.llama_server is None:
        return []
    from tandem_launcher.embedded import embedded_gguf  # noqa: PLC0415

    base = shlex.split(args.llama_server_args)
    configs = {
        "llama-server": base,
        "llama-server spec": [*base, *shlex.split(args.llama_spec_args)],
    }
    return [
        (
            name,
            LaunchedLlamaServer(
                LlamaServerConfig(args.llama_server, embedded_gguf().path, args.concurrency, extra_args=tuple(extra)),
                args.log_dir / f"{name.replace(' ', '-')}.log",
            ),
        )
        for name, extra in configs.items()
    ]


def _embedded_model_dir() -> Path:
    # The launcher converts the embedded GGUF on its first start, before the drafting server resolves its draft.
    from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR  # noqa: PLC0415
    from tandem_launcher.embedded import converted_model_dir, embedded_gguf  # noqa: PLC0415

    return converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    extra = shlex.split(args.launcher_args)
    drafting_flags = [*extra, "--speculate", str(args.speculate), "--speculative-method", args.method]
    with ExitStack() as servers:
        plain = servers.enter_context(LaunchedTandem(args.log_dir / "plain.log", extra))
        drafting = servers.enter_context(
            LaunchedTandem(args.log_dir / "drafting.log", [*drafting_flags, *_draft_flags(args)])
        )
        peers = [(name, servers.enter_context(peer)) for name, peer in _llama_servers(args)]
        rows = measure(plain, drafting, peers, args)
    draft = f" --draft-layers {args.draft_layers}" if args.method == "draft" and args.draft_layers else ""
    print(
        f"{args.concurrency} stream(s), greedy, {args.output_len} tokens, {args.rounds} rounds, "
        f"--speculate {args.speculate} --speculative-method {args.method}{draft}"
    )
    if args.llama_server is not None:
        print(f"llama-server: {args.llama_server_args or '-'}; speculative run: {args.llama_spec_args}")
    print(_header([name for name, _ in peers]))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
