"""The KV block size: the user's --block-size, else the page size the attention backend the shards will take reads
fastest. Decided here, before any shard starts, because the router and every shard must page alike."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from collections.abc import Callable

DEFAULT_BLOCK_SIZE = 16
# flash-attn-4 reads any page size, but loads a page with TMA only when it is exactly one key tile of 128 tokens;
# any other size takes its slower cp.async path, where Tandem's Triton kernel (which splits decode work across the
# SMs) is the faster choice, so the shards' `auto` takes flash-attn-4 at 128-token blocks only.
FLASH_ATTN_4_TMA_PAGE = 128
FLASH_ATTN_4_DISTRIBUTION = "flash-attn-4"
# Compute capability majors flash-attn-4 has kernels for (Hopper and Blackwell).
FLASH_ATTN_4_MAJORS = (9, 10, 11)
# flash-attn 2 reads the paged KV cache only in blocks of a multiple of 256 tokens.
FLASH_ATTN_2_PAGE = 256

# Why flash-attn-4 serves this machine's GPUs ("flash-attn-4 ... on compute capability 9.0"), or None.
FlashAttn4Probe = Callable[[], str | None]


def choose_block_size(
    block_size: int | None, attention_backend: str, device: str, flash_attn_4: FlashAttn4Probe
) -> tuple[int, str]:
    """Tokens per KV block and why."""
    if block_size is not None:
        return block_size, "--block-size"
    if device != "cuda" or attention_backend not in ("auto", "flash"):
        return DEFAULT_BLOCK_SIZE, "the default"
    served = flash_attn_4()
    if served is not None:
        return FLASH_ATTN_4_TMA_PAGE, f"{served} loads pages of {FLASH_ATTN_4_TMA_PAGE} tokens with TMA, its fast path"
    if attention_backend == "flash":
        return FLASH_ATTN_2_PAGE, f"--attention-backend flash pages the KV cache in multiples of {FLASH_ATTN_2_PAGE}"
    return DEFAULT_BLOCK_SIZE, "the default (flash-attn-4 does not serve these GPUs; the Triton kernel pages any size)"


def probe_flash_attn_4(run: Callable[[list[str]], str | None] | None = None) -> str | None:
    """Whether flash-attn-4 is installed and every visible GPU has kernels in it, from package metadata and
    `nvidia-smi` (no CUDA context is created in the launcher)."""
    try:
        version = importlib.metadata.version(FLASH_ATTN_4_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    output = (run or _run_nvidia_smi)(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
    capabilities = parse_capabilities(output or "")
    if not capabilities or any(int(capability.split(".")[0]) not in FLASH_ATTN_4_MAJORS for capability in capabilities):
        return None
    return f"flash-attn-4 {version} on compute capability {', '.join(dict.fromkeys(capabilities))}"


def parse_capabilities(output: str) -> list[str]:
    """The "major.minor" lines of `nvidia-smi --query-gpu=compute_cap`; anything else is ignored."""
    lines = [line.strip() for line in output.splitlines()]
    return [line for line in lines if line.count(".") == 1 and line.replace(".", "").isdigit()]


def _run_nvidia_smi(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
