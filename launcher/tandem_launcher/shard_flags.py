"""The shard's flags the launcher forwards as they are, one entry each (see `forwarded.py`). The shard resolves
their `auto` values from its model and device (tandem_server/weight_defaults.py and device_defaults.py); the
launcher only refuses, before any download, an option the chosen device cannot use."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY
from tandem_server.weights.gguf_format import QUANTIZE_CHOICES

from tandem_launcher.flags import compile_mode
from tandem_launcher.forwarded import Check, Child, Forwarded, switch
from tandem_launcher.lora_adapters import LORA_FLAGS

SHARD = Child.SHARD
AUTO = "auto"
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Weight formats the CUDA shard multiplies by; the others have CPU kernels only.
CUDA_QUANTIZE = ("auto", "none", "int4", "fp8")
TORCH_COMPILE_ON_CUDA = "--torch-compile is a CPU option; CUDA steps replay CUDA graphs (--cuda-graphs) instead"

_BATCH_SIZES = re.compile(r"^\s*(\d+\s*(,\s*\d+\s*)*)?$")
_MEMORY_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$", re.IGNORECASE)


def is_memory_size(text: str) -> bool:
    """True for sizes such as `1GiB`, `512MB`, `24MiB` or a plain byte count."""
    return _MEMORY_SIZE.match(text) is not None


def is_zero_size(text: str) -> bool:
    """ "0", "0GiB" and "0.0 MB" all mean no memory."""
    size = _MEMORY_SIZE.match(text)
    return size is not None and float(size.group(1)) == 0.0


def memory_size(text: str) -> str:
    """A flag value that must be a size such as 1GiB."""
    if not is_memory_size(text):
        raise argparse.ArgumentTypeError(f"not a size such as 1GiB or 512MB: {text!r}")
    return text.strip()


def memory_or_auto(text: str) -> str:
    """A size, or `auto` for the shard's choice."""
    return AUTO if text.strip() == AUTO else memory_size(text)


def _sizes_word(sizes: str) -> str:
    # Comma-separated sizes without spaces; "0" (none) for an empty list.
    sizes = sizes.replace(" ", "")
    return "0" if sizes in ("", "0") else sizes


def _sizes_check(example: str) -> Check:
    def check(flag: str, value: str) -> str | None:
        if value.strip() == AUTO or _BATCH_SIZES.match(value) is not None:
            return None
        return f"{flag} must be {example} or 0, got {value!r}"

    return check


def _memory_check(flag: str, value: str) -> str | None:
    if value.strip() == AUTO or is_memory_size(value):
        return None
    return f"{flag} must be a size such as 1GiB or 512MB, got {value!r}"


def _fraction(flag: str, value: float) -> str | None:
    return None if 0.0 < value <= 1.0 else f"{flag} must be in (0, 1], got {value}"


DTYPE = (
    Forwarded(
        "--dtype", SHARD, str, AUTO,
        "weights and activations dtype; auto: bfloat16 on CUDA and on CPUs with AMX or AVX-512 BF16, else float32",
        choices=DTYPES,
    ),
)  # fmt: skip

EXECUTION = (
    Forwarded(
        "--kv-cache-memory", SHARD, memory_or_auto, AUTO,
        "CPU: memory each shard's KV cache takes, e.g. 1GiB; auto: room for 12288 tokens of the model, at most 1GiB "
        "and a quarter of the memory available after loading (split between shards), logged with the reason",
        check=_memory_check,
    ),
    Forwarded(
        "--encoder-cache-memory", SHARD, memory_size, "256MiB",
        "vision-language models: memory each shard keeps the embeddings of recent images in, so a repeated image "
        "skips the vision encoder (on CUDA taken from the KV cache's share); 0: encode every image",
    ),
    Forwarded(
        "--kv-offload-memory", SHARD, memory_size, "0",
        "host memory each shard keeps KV blocks in once the router evicts them from the KV cache, so a later prefix "
        "hit loads them back instead of recomputing them, e.g. 8GiB; 0: off",
    ),
    Forwarded(
        "--kv-offload-dir", SHARD, str, None,
        "a directory for a disk tier behind --kv-offload-memory: host entries pushed out go there (each shard under "
        "rank-N/), checksummed, and a torn entry is recomputed",
    ),
    Forwarded(
        "--kv-offload-disk", SHARD, memory_size, "16GiB",
        "the disk tier's size under --kv-offload-dir", only_with="kv_offload_dir",
    ),
    Forwarded(
        "--kv-cache-dtype", SHARD, str, AUTO,
        "dtype of the KV cache, in which attention computes; auto: the model's --dtype; bfloat16 under a float32 "
        "model holds twice the tokens per byte (needs the "
        + " or ".join(ATTENTION_REGISTRY.names_with(lambda capabilities: capabilities.other_kv_cache_dtype))
        + " attention backend)",
        choices=DTYPES,
    ),
    Forwarded(
        "--cuda-memory-fraction", SHARD, float, 0.9,
        "CUDA: share of free memory (after a profiled step) for the KV cache", check=_fraction,
    ),
    Forwarded(
        "--cuda-graphs", SHARD, str, AUTO,
        "CUDA: batch sizes whose decode (and draft-verifying) steps replay CUDA graphs, e.g. 1,2,4,8; 0 disables; "
        "auto: 1,2,4,...,64 on CUDA, none on CPU",
        check=_sizes_check("batch sizes such as 1,2,4,8"), word=_sizes_word,
    ),
    Forwarded(
        "--packed-gemm-rows", SHARD, str, AUTO,
        "CPU: decode batch sizes whose GEMMs use prepacked weights, e.g. 32 or 16,32 (float32: one MKL copy per "
        "size; bfloat16: one oneDNN copy for every batch up to 256 rows); 0 disables; auto: 32 on CPU, none on CUDA",
        check=_sizes_check("row counts such as 32"), word=_sizes_word,
    ),
    Forwarded(
        "--quantize", SHARD, str, AUTO,
        "GEMM weights (auto, none, gguf, int8, int4 or fp8); auto: gguf for a GGUF model on CPU (the embedded model "
        "is one), else none; gguf (CPU): a .gguf model's Q4_0/Q4_1/Q8_0 tensors served as they are; int8, int4 "
        "(CPU): float weights quantized at load, bfloat16 activations; fp8 (CPU, CUDA sm89+): float weights as "
        "float8 e4m3 per channel, activations per token; none: float. An FP8 checkpoint (compressed-tensors, "
        "fbgemm_fp8) keeps its float8 layers with none, auto or fp8",
        choices=(AUTO, *QUANTIZE_CHOICES),
    ),
    switch(
        "--expert-parallel", SHARD,
        "with several shards, each holds whole routed experts of a mixture-of-experts model (a contiguous share of "
        "them, float weights) instead of a slice of every expert; attention and shared experts still split",
    ),
    Forwarded(
        "--decode-mirror-memory", SHARD, memory_or_auto, AUTO,
        "CPU: memory each shard may use for contiguous copies of decoding requests' keys and values, which decode "
        "attention reads instead of gathering cache blocks every step; 0 disables; auto: half of the KV cache on CPU, "
        "0 on CUDA",
        check=_memory_check,
    ),
    Forwarded(
        "--quantized-dense-memory", SHARD, memory_or_auto, AUTO,
        "CPU, quantized weights: memory each shard may use for bfloat16 copies of them, which batches of 6 or more "
        "rows multiply by instead; 0: none; auto: half the available memory, split between shards, where the CPU "
        "has AMX or AVX-512 BF16 and activations are bfloat16, else 0",
        check=_memory_check,
    ),
    Forwarded(
        "--torch-compile", SHARD, compile_mode, None,
        "CPU: compile the forward pass of decode steps on the decode mirror into one graph (Inductor). "
        "background: a single stream's decode steps run a graph compiled ahead of time (AOTInductor) by a child "
        "process at the lowest CPU priority and kept in --compile-cache-dir, taking over once loaded (about a "
        "minute for the embedded model on 2 cores, under a second from the cache); with several shards, each "
        "compiles on a thread between steps instead; warmup (the flag alone, or true): the graphs of every batch "
        "size and each decoder layer's stages compile before Tandem is ready; off: every step eager; unset: the "
        "shard's auto, background on CPU where a C++ compiler is found, else off",
        alone="warmup",
    ),
    Forwarded(
        "--compile-cache-dir", SHARD, str, None,
        "where --torch-compile background keeps its compiled decode graphs across restarts (one file per model, "
        "weight flags, torch version and CPU); unset: the shard's ~/.cache/tandem/compiled",
    ),
    Forwarded(
        "--attention-backend", SHARD, str, AUTO,
        f"attention kernels; auto: {ATTENTION_REGISTRY.describe_auto()}",
        choices=ATTENTION_REGISTRY.choices,
    ),
)  # fmt: skip

SHARD_FLAGS = DTYPE + EXECUTION + LORA_FLAGS


def device_problems(device: str, values: Mapping[str, Any]) -> list[str]:
    """Options the shard would refuse on `device` (a given value other than auto or none), named as it names them."""
    off = {
        "--cuda-graphs": device == "cuda" or _is_auto_or_none(values["cuda_graphs"], is_sizes=True),
        "--packed-gemm-rows": device == "cpu" or _is_auto_or_none(values["packed_gemm_rows"], is_sizes=True),
        "--decode-mirror-memory": device == "cpu" or _is_auto_or_none(values["decode_mirror_memory"]),
        "--quantized-dense-memory": device == "cpu" or _is_auto_or_none(values["quantized_dense_memory"]),
    }
    problems = [_device_message(flag) for flag, fits in off.items() if not fits]
    if device != "cpu" and values["quantize"] not in CUDA_QUANTIZE:
        problems.append(f"--quantize {values['quantize']} is a CPU option; on CUDA use none, int4 or fp8")
    if device != "cpu" and values["torch_compile"] in ("warmup", "background"):
        problems.append(TORCH_COMPILE_ON_CUDA)
    return problems


def _is_auto_or_none(value: str, is_sizes: bool = False) -> bool:
    if value.strip() == AUTO:
        return True
    return _sizes_word(value) == "0" if is_sizes else is_zero_size(value)


def _device_message(flag: str) -> str:
    if flag == "--cuda-graphs":
        return "--cuda-graphs needs --device cuda; use --cuda-graphs 0 on CPU"
    if flag == "--packed-gemm-rows":
        return "--packed-gemm-rows is a CPU option; use --packed-gemm-rows 0 on CUDA"
    return f"{flag} is a CPU option; use {flag} 0 on CUDA"
