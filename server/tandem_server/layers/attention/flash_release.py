"""The FlashAttention releases the flash backend can drive, and what each asks of the GPU and the KV cache's pages.

flash-attn 2 (`flash_attn`, a CUDA extension built from source) reads a paged cache through `block_table` only when
a page holds a multiple of 256 tokens, on Ampere and newer. flash-attn-4 (`flash_attn.cute`, CuTe DSL kernels
compiled at first use, pure-Python wheels) reads any page size on Hopper and Blackwell (compute capability 9.x,
10.x, 11.x), but only a page of exactly one key tile (128 tokens) is loaded by TMA: any other size looks up every
key row's page itself (a divmod by the page size) on its slower cp.async path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlashRelease:
    """One FlashAttention release: where its varlen entry point lives and what it needs."""

    name: str
    module: str
    # Pages must hold a multiple of this many tokens.
    page_multiple: int
    # Compute capability majors the release has kernels for.
    capability_majors: tuple[int, ...]
    # The page size of the release's fast paged path; None: no page size is faster than another.
    fast_page_size: int | None = None

    def load(self) -> Callable[..., Any]:
        """The release's `flash_attn_varlen_func`."""
        return importlib.import_module(self.module).flash_attn_varlen_func

    def page_problem(self, block_size: int) -> str | None:
        """Why this release cannot read pages of `block_size` tokens, or None when it can."""
        if block_size % self.page_multiple:
            return (
                f"{self.name} reads the paged KV cache only in blocks of a multiple of {self.page_multiple} tokens, "
                f"not {block_size}"
            )
        return None

    def capability_problem(self, capability: tuple[int, int]) -> str | None:
        """Why this release has no kernels for a GPU of `capability`, or None when it has."""
        if capability[0] in self.capability_majors:
            return None
        return f"{self.name} has no kernels for compute capability {capability[0]}.{capability[1]}"


FLASH_ATTN_4 = FlashRelease("flash-attn-4", "flash_attn.cute", 1, (9, 10, 11), fast_page_size=128)
FLASH_ATTN_2 = FlashRelease("flash-attn 2", "flash_attn", 256, (8, 9, 10, 11, 12))
# Preference order when both are installed.
RELEASES = (FLASH_ATTN_4, FLASH_ATTN_2)


def import_problem(release: FlashRelease) -> str | None:
    """Why the release's entry point does not import, or None when it does."""
    try:
        release.load()
    except (ImportError, AttributeError, OSError, RuntimeError) as error:
        return f"{release.module} is not importable ({error})"
    return None


def choose_release(capability: tuple[int, int]) -> tuple[FlashRelease | None, tuple[str, ...]]:
    """The newest release that imports and has kernels for `capability`, and why each other one does not fit."""
    problems: list[str] = []
    for release in RELEASES:
        problem = import_problem(release) or release.capability_problem(capability)
        if problem is None:
            return release, tuple(problems)
        problems.append(problem)
    return None, tuple(problems)
