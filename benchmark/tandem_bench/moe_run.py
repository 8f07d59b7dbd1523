"""`tandem-bench moe`: a tiny random-weight Mixtral-shaped model (8 experts, top-2) served by Tandem at 32
concurrent streams, against `transformers` static batching of the same batch in the same dtype.

The checkpoint is drawn once into the log directory with the embedded model's tokenizer; the baseline runs right
before and right after Tandem and its two runs are averaged, so a machine whose speed drifts favours neither side.

By default every request asks for the same number of tokens, static batching's best case. `--output-len-spread`
draws each request's length around `--output-len` (seeded), and `--requests` sends more requests than streams: the
baseline then runs them in batches of `--streams` in order, each batch generating its longest request's tokens,
while only each request's own tokens count on both sides.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tandem_bench.peers import run_transformers_static
from tandem_bench.random_model import TOKENIZER_FILES
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import completion_tokens, post_completion, served_model
from tandem_bench.words import WORDS

COMMAND = "tandem-bench moe"
# Mixtral's layout at a size two CPU cores serve in seconds: 4 layers, 8 experts of 1024 features, top-2.
TINY_MIXTRAL: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def tiny_moe_config(vocab_size: int, bos_token_id: int, eos_token_id: int, dtype: str) -> dict[str, Any]:
    """The benchmark model's config.json for a tokenizer of `vocab_size` entries, stored in `dtype`."""
    return {
        **TINY_MIXTRAL,
        "vocab_size": vocab_size,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "dtype": dtype,
    }


def write_tiny_moe(directory: Path, tokenizer_dir: Path, dtype: str, seed: int = 0) -> None:
    """Draws the model with transformers' own initialisation and saves it beside the tokenizer of `tokenizer_dir`."""
    import torch  # noqa: PLC0415  (only the writer needs torch and transformers)
    from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_moe_config(len(tokenizer), tokenizer.bos_token_id or 0, tokenizer.eos_token_id or 0, dtype)
    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(**config)).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and name != "generation_config.json":
            (directory / name).write_bytes((tokenizer_dir / name).read_bytes())


@dataclass(frozen=True)
class StreamsResult:
    """Output tokens of `streams` concurrent requests and the wall time until the last one ended."""

    streams: int
    tokens: int
    seconds: float

    @property
    def output_throughput(self) -> float:
        return self.tokens / self.seconds


class Throughput(Protocol):
    @property
    def output_throughput(self) -> float: ...


@dataclass(frozen=True)
class StaticBatches:
    """`transformers` static batching of a list of requests: `tokens` counts each request's own output only."""

    tokens: int
    seconds: float
    runs: int = 1

    @property
    def output_throughput(self) -> float:
        return self.tokens / self.seconds

    @classmethod
    def mean(cls, results: list[StaticBatches]) -> StaticBatches:
        """The average of runs over the same requests."""
        return cls(results[0].tokens, sum(r.seconds for r in results) / len(results), len(results))


def speedup(tandem: Throughput, baseline: Throughput) -> float:
    """Tandem's output tokens per second over the baseline's."""
    return tandem.output_throughput / baseline.output_throughput


def output_lengths(requests: int, output_len: int, spread: float, seed: int = 0) -> list[int]:
    """Each request's output tokens: `output_len` for all without spread, else drawn uniformly (seeded) from
    `output_len` times [1 - spread, 1 + spread]."""
    low = max(1, round(output_len * (1 - spread)))
    high = max(low, round(output_len * (1 + spread)))
    draw = random.Random(seed)
    return [draw.randint(low, high) for _ in range(requests)]


def static_batches(lengths: list[int], batch: int, input_len: int, dtype: str, model_dir: Path) -> StaticBatches:
    """Batches of `batch` requests in order, each one `generate` until its longest request's length."""
    chunks = [lengths[start : start + batch] for start in range(0, len(lengths), batch)]
    seconds = sum(
        run_transformers_static(len(chunk), input_len, max(chunk), dtype, model_dir).seconds for chunk in chunks
    )
    return StaticBatches(sum(lengths), seconds)


def _prompt(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 31 + 7 * i) % len(WORDS)] for i in range(words))


def concurrent_streams(
    server: LaunchedTandem, models: Sequence[str], lengths: list[int], args: argparse.Namespace
) -> StreamsResult:
    """One greedy request per entry of `lengths`, request i under `models[i % len(models)]`, at most `args.streams`
    at a time (each stream sends its next request as soon as its last one ends)."""
    bodies = [
        {
            "model": models[seed % len(models)],
            "prompt": _prompt(args.input_len, seed),
            "max_tokens": length,
            "ignore_eos": True,
        }
        for seed, length in enumerate(lengths)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(args.streams) as pool:
        answers = list(pool.map(post_completion, [server.base_url] * len(bodies), bodies))
    seconds = time.perf_counter() - started
    return StreamsResult(args.streams, sum(completion_tokens(answer) for answer in answers), seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--streams", type=int, default=32, help="concurrent requests, and the baseline's batch")
    parser.add_argument("--input-len", type=int, default=50, help="prompt words (about one token each)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens each request generates (the mean)")
    parser.add_argument(
        "--output-len-spread",
        type=float,
        default=0.0,
        help="draw each request's length from --output-len times [1 - spread, 1 + spread]; 0: all equal",
    )
    parser.add_argument("--requests", type=int, default=None, help="requests per round (default: --streams)")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds of Tandem, after one unmeasured")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16", help="both sides' dtype")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags (one string)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "moe")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR  # noqa: PLC0415
    from tandem_launcher.embedded import converted_model_dir, embedded_gguf  # noqa: PLC0415

    model_dir = args.log_dir / f"tiny-mixtral-{args.dtype}"
    if not (model_dir / "config.json").is_file():
        write_tiny_moe(model_dir, converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR), args.dtype)
    if not 0.0 <= args.output_len_spread < 1.0:
        raise SystemExit("--output-len-spread must be in [0, 1)")
    lengths = output_lengths(args.requests or args.streams, args.output_len, args.output_len_spread)
    static = [static_batches(lengths, args.streams, args.input_len, args.dtype, model_dir)]
    flags = ["--model-id", str(model_dir), "--dtype", args.dtype, *args.launcher_args.split()]
    with LaunchedTandem(args.log_dir / "tandem.log", flags) as server:
        model = served_model(server.base_url)
        concurrent_streams(server, [model], lengths, args)
        rounds = [concurrent_streams(server, [model], lengths, args) for _ in range(args.rounds)]
    static.append(static_batches(lengths, args.streams, args.input_len, args.dtype, model_dir))
    baseline = StaticBatches.mean(static)
    tandem = StreamsResult(args.streams, sum(r.tokens for r in rounds), sum(r.seconds for r in rounds))
    print(
        f"tiny Mixtral (8 experts, top-2), {args.dtype}, {len(lengths)} requests of {min(lengths)}-{max(lengths)} "
        f"tokens (mean {sum(lengths) / len(lengths):.0f}) over {args.streams} streams"
    )
    print("| engine | output tok/s |")
    print("|---|---|")
    print(f"| transformers static batch (mean of {baseline.runs}) | {baseline.output_throughput:.1f} |")
    print(f"| Tandem ({args.rounds} rounds) | {tandem.output_throughput:.1f} |")
    print(f"Tandem / transformers: {speedup(tandem, baseline):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
