"""Chooses the attention backend once at start-up from the device, installed packages and the model's features."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem_server.errors import ConfigError
from tandem_server.layers.attention.flash_release import FlashRelease, choose_release

BACKEND_NAMES = ("torch", "sdpa", "triton", "flash")
BACKEND_CHOICES = ("auto", *BACKEND_NAMES)
# `auto` takes the first usable backend in this order.
AUTO_ORDER = {"cuda": ("flash", "triton", "sdpa", "torch"), "cpu": ("torch",)}
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256
# The Triton kernel's tiles are checked to fit every supported GPU's shared memory up to this head size.
TRITON_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class AttentionNeeds:
    """What the model and device ask of an attention backend (every backend handles sliding windows)."""

    device: str
    dtype: torch.dtype
    head_dim: int
    logit_softcap: bool = False
    # The KV cache's dtype; None: the model's.
    kv_cache_dtype: torch.dtype | None = None
    # Tokens per KV block the router pages with; None: not known before Warmup.
    block_size: int | None = None


@dataclass(frozen=True)
class PackageProblems:
    """Why an optional package cannot be used (None: it imports fine)."""

    flash_attn: str | None
    triton: str | None
    # The FlashAttention release the flash backend drives on this GPU; None when `flash_attn` says why none.
    flash_release: FlashRelease | None = None


@dataclass(frozen=True)
class BackendChoice:
    """The chosen backend and, for `auto`, why each earlier candidate was passed over."""

    name: str
    skipped: tuple[tuple[str, str], ...] = field(default=())

    def describe(self) -> str:
        """One log line: the choice and the reasons behind it."""
        if not self.skipped:
            return f"attention backend {self.name}"
        passed_over = "; ".join(f"{name}: {reason}" for name, reason in self.skipped)
        return f"attention backend {self.name} (passed over {passed_over})"


def needs_from_hf_config(
    hf: Mapping[str, Any],
    device: str,
    dtype: torch.dtype,
    kv_cache_dtype: torch.dtype | None = None,
    block_size: int | None = None,
) -> AttentionNeeds:
    """The attention features of a checkpoint's config.json that narrow the choice: softcap and head size."""
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"]))
    softcap = hf.get("attn_logit_softcapping") is not None
    return AttentionNeeds(device, dtype, head_dim, softcap, kv_cache_dtype, block_size)


def detect_package_problems(device: str) -> PackageProblems:
    """Imports FlashAttention and Triton only on CUDA; on CPU neither is usable anyway."""
    if device != "cuda":
        return PackageProblems(flash_attn="needs --device cuda", triton="needs --device cuda")
    release, problems = choose_release(torch.cuda.get_device_capability())
    flash_problem = None if release is not None else "; ".join(problems)
    return PackageProblems(flash_attn=flash_problem, triton=_import_problem("triton"), flash_release=release)


def unusable_reason(name: str, needs: AttentionNeeds, packages: PackageProblems) -> str | None:
    """Why backend `name` cannot serve this model on this device, or None when it can."""
    if name == "torch":
        return None
    if needs.kv_cache_dtype not in (None, needs.dtype):
        return "it keeps the KV cache in the model's dtype only (--kv-cache-dtype needs the torch backend)"
    if name == "sdpa":
        return "torch SDPA cannot apply attention logit softcapping" if needs.logit_softcap else None
    if needs.device != "cuda":
        return f"{name} needs --device cuda"
    if name == "triton":
        return _triton_problem(needs, packages)
    return _flash_problem(needs, packages)


def _triton_problem(needs: AttentionNeeds, packages: PackageProblems) -> str | None:
    if needs.head_dim > TRITON_MAX_HEAD_DIM:
        return f"the Triton kernel supports head sizes up to {TRITON_MAX_HEAD_DIM}, not {needs.head_dim}"
    return packages.triton


def _flash_problem(needs: AttentionNeeds, packages: PackageProblems) -> str | None:
    if packages.flash_attn is not None:
        return (
            f"{packages.flash_attn} (on Hopper or Blackwell: flash-attn-4, pip install 'tandem-server[cuda]'; "
            "elsewhere flash-attn 2, built from source)"
        )
    if needs.dtype not in FLASH_DTYPES:
        return f"flash-attn supports float16 and bfloat16, not {str(needs.dtype).removeprefix('torch.')}"
    if needs.head_dim > FLASH_MAX_HEAD_DIM or needs.head_dim % 8:
        return f"flash-attn supports head sizes up to {FLASH_MAX_HEAD_DIM} in steps of 8, not {needs.head_dim}"
    return None


def select_backend(requested: str, needs: AttentionNeeds, packages: PackageProblems) -> BackendChoice:
    """`auto` picks the first usable backend for the device; a named backend that cannot run is an error."""
    if requested not in BACKEND_CHOICES:
        raise ConfigError(f"unknown attention backend {requested!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    if requested != "auto":
        reason = unusable_reason(requested, needs, packages)
        if reason is not None:
            raise ConfigError(f"--attention-backend {requested} is unavailable: {reason}")
        return BackendChoice(requested)
    skipped: list[tuple[str, str]] = []
    for name in AUTO_ORDER[needs.device]:
        reason = unusable_reason(name, needs, packages) or _auto_problem(name, needs, packages)
        if reason is None:
            return BackendChoice(name, tuple(skipped))
        skipped.append((name, reason))
    raise ConfigError("invariant: the torch attention backend is always usable")


def _auto_problem(name: str, needs: AttentionNeeds, packages: PackageProblems) -> str | None:
    # flash-attn-4 away from its TMA page size runs its slow paged path, and it does not split decode work across
    # the SMs as the Triton kernel does: `auto` takes flash only at that page size (named, it serves any block size
    # its release pages).
    release = packages.flash_release
    if name != "flash" or release is None:
        return None
    if release.fast_page_size is None:
        return f"{release.name} has no paged path faster than the Triton kernel (--attention-backend flash takes it)"
    if needs.block_size != release.fast_page_size:
        return (
            f"{release.name} loads pages with TMA only at --block-size {release.fast_page_size}, not "
            f"{needs.block_size}; the Triton kernel is faster at other sizes"
        )
    return None


def _import_problem(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        return f"{module} is not importable ({error})"
    return None
