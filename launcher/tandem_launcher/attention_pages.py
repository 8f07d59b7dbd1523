"""The KV block size: the user's --block-size, else the page size the attention backend the shards will take reads
fastest. Decided here, before any shard starts, because the router and every shard must page alike.

The block sizes each backend reads come from the shard's torch-free registry (`tandem_server.interfaces`); this
module only probes whether a release with a fast page size serves this machine's GPUs, without a CUDA context.
"""

from __future__ import annotations

import importlib.metadata
import math
import shutil
import subprocess
from collections.abc import Callable

from tandem_server.interfaces.attention import (
    AUTO,
    DEFAULT_BLOCK_SIZE,
    BackendCapabilities,
    BackendRegistry,
    PackageRelease,
)
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY

# Why a package release serves this machine's GPUs ("flash-attn-4 4.0.0 on compute capability 9.0"), or None.
ReleaseProbe = Callable[[PackageRelease], str | None]


def choose_block_size(
    block_size: int | None,
    attention_backend: str,
    device: str,
    probe: ReleaseProbe,
    registry: BackendRegistry = ATTENTION_REGISTRY,
) -> tuple[int, str]:
    """Tokens per KV block and why: for `auto`, those of the first backend it may take on `device`."""
    if block_size is not None:
        return block_size, "--block-size"
    auto = attention_backend == AUTO
    if not auto and attention_backend not in registry.names:
        # An unknown name (from the environment, which argparse's choices miss) is refused with the forwarded flags.
        return DEFAULT_BLOCK_SIZE, "the default"
    candidates = registry.auto_order(device) if auto else (attention_backend,)
    not_serving: list[str] = []
    for name in candidates:
        capabilities = registry.capabilities(name)
        if device not in capabilities.devices:
            # The shard refuses the backend on this device.
            return DEFAULT_BLOCK_SIZE, "the default"
        fast = _fast_pages(capabilities, probe)
        if fast is not None:
            return fast
        if auto and capabilities.auto_only_at_fast_pages_over is not None:
            # `auto` takes this backend only at a fast page size, which no release of it serves here.
            not_serving += [release.name for release in capabilities.releases if release.pages.fast is not None]
            continue
        return _least_block_size(name if auto else f"--attention-backend {name}", capabilities, not_serving)
    return DEFAULT_BLOCK_SIZE, "the default"


def _fast_pages(capabilities: BackendCapabilities, probe: ReleaseProbe) -> tuple[int, str] | None:
    """The fast page size of the backend's first release that has one and serves these GPUs, with why."""
    for release in capabilities.releases:
        fast = release.pages.fast
        if fast is None:
            continue
        served = probe(release)
        if served is not None:
            return fast, f"{served} loads pages of {fast} tokens with {release.pages.fast_loads}, its fast path"
    return None


def _least_block_size(label: str, capabilities: BackendCapabilities, not_serving: list[str]) -> tuple[int, str]:
    """The least block size from the default up that every release the backend may drive reads (each shard chooses
    its own release, so one whose fast page size did not serve these GPUs still counts)."""
    multiples = [release.pages.multiple for release in capabilities.releases] or [capabilities.pages.multiple]
    multiple = math.lcm(*multiples)
    size = -(-DEFAULT_BLOCK_SIZE // multiple) * multiple
    if size != DEFAULT_BLOCK_SIZE:
        return size, f"{label} pages the KV cache in multiples of {multiple}"
    if not not_serving:
        return size, "the default"
    pages = "any size" if multiple == 1 else f"in multiples of {multiple}"
    return (
        size,
        f"the default ({', '.join(not_serving)} does not serve these GPUs; {capabilities.kernel} pages {pages})",
    )


def describe_block_sizes() -> str:
    """How an unset --block-size is chosen, for the help text."""
    entries = [(name, ATTENTION_REGISTRY.capabilities(name).releases) for name in ATTENTION_REGISTRY.names]
    fast = [
        f"{release.pages.fast} where {release.name} serves the GPUs (its {release.pages.fast_loads} pages)"
        for _, releases in entries
        for release in releases
        if release.pages.fast is not None
    ]
    multiples = [
        f"{release.pages.multiple} with --attention-backend {name} on {release.name}"
        for name, releases in entries
        for release in releases
        if release.pages.multiple > 1
    ]
    return f"unset: {', '.join([*fast, *multiples])}, else {DEFAULT_BLOCK_SIZE}"


def probe_release(release: PackageRelease, run: Callable[[list[str]], str | None] | None = None) -> str | None:
    """Whether `release` is installed and every visible GPU has kernels in it, from package metadata and
    `nvidia-smi` (no CUDA context is created in the launcher)."""
    try:
        version = importlib.metadata.version(release.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    output = (run or _run_nvidia_smi)(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
    capabilities = parse_capabilities(output or "")
    majors = release.capability_majors
    if not capabilities or (majors is not None and any(int(cap.split(".")[0]) not in majors for cap in capabilities)):
        return None
    return f"{release.name} {version} on compute capability {', '.join(dict.fromkeys(capabilities))}"


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
