"""`tandem-bench moe`: a tiny random-weight Mixtral-shaped model (8 experts, top-2) served by Tandem at 32
concurrent streams, against `transformers` static batching of the same batch in the same dtype.

The checkpoint is drawn once into the log directory with the embedded model's tokenizer; the baseline runs right
before and right after Tandem and its two runs are averaged, so a machine whose speed drifts favours neither side.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_bench.peers import StaticBatchResult, run_transformers_static
from tandem_bench.random_model import TOKENIZER_FILES
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import post_completion, served_model
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


def speedup(tandem: StreamsResult, baseline: StaticBatchResult) -> float:
    """Tandem's output tokens per second over the baseline's."""
    return tandem.output_throughput / baseline.output_throughput


def _prompt(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 31 + 7 * i) % len(WORDS)] for i in range(words))


def concurrent_streams(server: LaunchedTandem, model: str, args: argparse.Namespace) -> StreamsResult:
    """`args.streams` greedy requests of `args.output_len` tokens each, sent at once."""
    bodies = [
        {"model": model, "prompt": _prompt(args.input_len, seed), "max_tokens": args.output_len, "ignore_eos": True}
        for seed in range(args.streams)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(args.streams) as pool:
        answers = list(pool.map(post_completion, [server.base_url] * len(bodies), bodies))
    seconds = time.perf_counter() - started
    return StreamsResult(args.streams, sum(_completion_tokens(answer) for answer in answers), seconds)


def _completion_tokens(answer: dict[str, object]) -> int:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        raise ValueError(f"a completion without usage: {answer}")
    return int(usage["completion_tokens"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--streams", type=int, default=32, help="concurrent requests, and the baseline's batch")
    parser.add_argument("--input-len", type=int, default=50, help="prompt words (about one token each)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens each request generates")
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
    static = [run_transformers_static(args.streams, args.input_len, args.output_len, args.dtype, model_dir)]
    flags = ["--model-id", str(model_dir), "--dtype", args.dtype, *args.launcher_args.split()]
    with LaunchedTandem(args.log_dir / "tandem.log", flags) as server:
        model = served_model(server.base_url)
        concurrent_streams(server, model, args)
        rounds = [concurrent_streams(server, model, args) for _ in range(args.rounds)]
    static.append(run_transformers_static(args.streams, args.input_len, args.output_len, args.dtype, model_dir))
    baseline = StaticBatchResult.mean(static)
    tandem = StreamsResult(args.streams, sum(r.tokens for r in rounds), sum(r.seconds for r in rounds))
    print(f"tiny Mixtral (8 experts, top-2), {args.dtype}, {args.streams} streams of {args.output_len} tokens")
    print("| engine | output tok/s |")
    print("|---|---|")
    print(f"| transformers static batch (mean of {baseline.runs}) | {baseline.output_throughput:.1f} |")
    print(f"| Tandem ({args.rounds} rounds) | {tandem.output_throughput:.1f} |")
    print(f"Tandem / transformers: {speedup(tandem, baseline):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
