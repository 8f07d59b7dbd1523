"""The `transformers` static-batching baseline: one `generate` call over a batch of equal-length prompts.

Run: uv run --no-sync python benchmark/scripts/transformers_static.py [--batch 32] [--input-len 50] [--output-len 128]
[--dtype float32|bfloat16] [--model-dir DIR]. The model is the embedded SmolLM2 checkpoint the launcher converts unless
--model-dir names another, greedy, every sequence generating exactly --output-len tokens; prints output tokens/s and
the mean decode step as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from tandem_bench.words import WORDS
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer


def prompts(batch: int, input_len: int, tokenizer: AutoTokenizer, seed: int) -> torch.Tensor:
    """`batch` rows of exactly `input_len` token ids from random common words (no padding is needed)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(batch):
        ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(input_len * 2)), add_special_tokens=False).input_ids
        rows.append(ids[:input_len])
    return torch.tensor(rows)


def timed_generate(model: AutoModelForCausalLM, ids: torch.Tensor, new_tokens: int) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=50)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--model-dir", default=None, help="a transformers checkpoint (default: the embedded model)")
    args = parser.parse_args()
    model_dir = args.model_dir or converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    ids = prompts(args.batch, args.input_len, tokenizer, args.seed)
    timed_generate(model, ids[:1, :8], 4)  # warm-up
    prefill_s = timed_generate(model, ids, 1)
    total_s = timed_generate(model, ids, args.output_len)
    decode_step_s = (total_s - prefill_s) / max(1, args.output_len - 1)
    result = {
        "engine": "transformers static batch",
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "batch": args.batch,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seconds": round(total_s, 2),
        "output_tok_s": round(args.batch * args.output_len / total_s, 1),
        "prefill_s": round(prefill_s, 3),
        "decode_step_ms": round(1000 * decode_step_s, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
