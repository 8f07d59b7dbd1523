"""How far Tandem's model in a lower precision strays from float32 on the embedded model: the accuracy bound behind
running it with `--dtype bfloat16` (or `float16`), or keeping its KV cache in one (`--kv-cache-dtype`), on CPU.

Run: uv run --no-sync python benchmark/scripts/dtype_agreement.py [--dtype bfloat16] [--kv-cache-dtype bfloat16]
[--prompts 16] [--new-tokens 64]
Each prompt (random common words) is continued greedily in float32; both precisions then score the same sequence in
one forward pass, and the script reports how often their top-1 tokens agree over the generated positions and how far
their logits differ, as JSON.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from tandem_bench.words import WORDS
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
from tandem_server.distributed import ParallelContext
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tokenizers import Tokenizer

BLOCK_SIZE = 16
CPU = torch.device("cpu")


def score(model: CausalLM, dtype: torch.dtype, ids: list[int]) -> torch.Tensor:
    """Float32 logits of every position of `ids`, from one prefill over a fresh paged cache."""
    spec = model.spec
    geometry = CacheGeometry(spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, dtype)
    blocks = -(-len(ids) // BLOCK_SIZE)
    cache = KVCache(geometry, num_blocks=blocks + 1, device=CPU)
    batch = build_step_batch([ScheduledSpan(ids, 0, list(range(1, blocks + 1)))], BLOCK_SIZE, CPU)
    with torch.inference_mode():
        return model.compute_logits(forward_step(model, batch, cache.layers)).float()


def greedy(model: CausalLM, dtype: torch.dtype, prompt: list[int], new_tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(new_tokens):
        ids.append(int(score(model, dtype, ids)[-1].argmax()))
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument(
        "--kv-cache-dtype", choices=("bfloat16", "float16", "float32"), default=None, help="default: --dtype"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    low_dtype = getattr(torch, args.dtype)
    cache_dtype = getattr(torch, args.kv_cache_dtype or args.dtype)
    path = converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)
    checkpoint = read_checkpoint_config(path)
    reference = load_model(checkpoint, torch.float32, CPU, ParallelContext(), TorchAttentionBackend())
    low = load_model(checkpoint, low_dtype, CPU, ParallelContext(), TorchAttentionBackend())
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    rng = random.Random(0)
    agree = total = 0
    max_error = sum_error = 0.0
    for _ in range(args.prompts):
        prompt = tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(args.prompt_words))).ids
        ids = greedy(reference, torch.float32, prompt, args.new_tokens)
        want, got = score(reference, torch.float32, ids), score(low, cache_dtype, ids)
        generated = slice(len(prompt) - 1, len(ids) - 1)
        agree += int((want[generated].argmax(-1) == got[generated].argmax(-1)).sum())
        total += args.new_tokens
        error = (want[generated] - got[generated]).abs().max(dim=-1).values
        max_error = max(max_error, float(error.max()))
        sum_error += float(error.sum())
    result = {
        "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype or args.dtype,
        "positions": total,
        "top1_agreement": round(agree / total, 4),
        "max_abs_logit_error": round(max_error, 3),
        "mean_of_per_position_max_error": round(sum_error / total, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
