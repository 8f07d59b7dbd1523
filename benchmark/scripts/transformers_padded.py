"""The `transformers` static-batching baseline over given prompts: one `generate` call on a left-padded batch.

Run: uv run --no-sync python benchmark/scripts/transformers_padded.py --model-dir DIR --prompts FILE [--output-len 128]
[--dtype float32|bfloat16]. FILE is a JSON list of prompt texts, all of which form one batch; greedy, every sequence
generating exactly --output-len tokens; prints the seconds, the output tokens and the mean prompt length as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedModel

# transformers runs the recurrent layers through these packages' Triton or CUDA kernels whenever they are installed,
# whatever the device; hidden, it takes its own torch path, the one a CPU can run.
GPU_KERNEL_PACKAGES = ("fla", "causal_conv1d", "mamba_ssm")


def timed_generate(model: PreTrainedModel, batch: BatchEncoding, new_tokens: int, pad_token_id: int) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_token_id
        )
    assert out.shape[1] == batch["input_ids"].shape[1] + new_tokens
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="a JSON list of prompt texts")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        for package in GPU_KERNEL_PACKAGES:
            sys.modules[package] = None
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  (after the packages are hidden)

    prompts: list[str] = json.loads(args.prompts.read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokenizer.pad_token_id = pad
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype)).eval()
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    warmup = tokenizer(prompts[:1], return_tensors="pt", padding=True, add_special_tokens=False)
    timed_generate(model, warmup, 4, pad)
    seconds = timed_generate(model, batch, args.output_len, pad)
    result = {
        "engine": "transformers static batch",
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "batch": len(prompts),
        "padded_len": int(batch["input_ids"].shape[1]),
        "mean_prompt_tokens": round(float(batch["attention_mask"].sum()) / len(prompts), 1),
        "output_len": args.output_len,
        "tokens": len(prompts) * args.output_len,
        "seconds": round(seconds, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
