"""Chooses the attention backend once at start-up: each registered backend's capabilities against the model, the
device and the optional packages installed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention import (
    AUTO,
    BackendCapabilities,
    BackendRegistry,
    PackageRelease,
    choose_release,
)
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY

BACKEND_NAMES = ATTENTION_REGISTRY.names
BACKEND_CHOICES = ATTENTION_REGISTRY.choices


@dataclass(frozen=True)
class AttentionNeeds:
    """What the model and device ask of an attention backend."""

    device: str
    dtype: torch.dtype
    head_dim: int
    logit_softcap: bool = False
    # The KV cache's dtype; None: the model's.
    kv_cache_dtype: torch.dtype | None = None
    # Tokens per KV block the router pages with; None: not known before Warmup.
    block_size: int | None = None
    sliding_window: bool = False
    # Multi-head latent attention (DeepSeek-V3's MLA): the cache holds a latent per token, not per-head K and V.
    latent_attention: bool = False
    # The model adds a learned sink per head to its attention softmax (gpt-oss).
    attention_sinks: bool = False
    # The positions of each image span attend to each other in both directions (Gemma 3's vision).
    bidirectional_spans: bool = False


@dataclass(frozen=True)
class ProbedPackages:
    """What probing each backend's optional package found: the release it drives, or why none is usable.

    A backend that needs a package and has no entry here was not probed (it cannot run on the device), and is
    unusable.
    """

    found: Mapping[str, PackageRelease | str] = field(default_factory=dict)

    def release(self, name: str) -> PackageRelease | None:
        """The release backend `name` drives, when its probe found one."""
        found = self.found.get(name)
        return found if isinstance(found, PackageRelease) else None


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
    attention_sinks: bool = False,
    bidirectional_spans: bool = False,
) -> AttentionNeeds:
    """The attention features of a checkpoint's config.json that narrow the choice: head size, softcap, windows;
    whether the family adds attention sinks is the model registry's to say, whether its image spans attend
    bidirectionally the vision family's (config.json says neither)."""
    head_dim = largest_head_dim(hf)
    softcap = hf.get("attn_logit_softcapping") is not None
    # A window applies where layer_types names sliding layers, else wherever one is set and not switched off (Qwen2's
    # `use_sliding_window`); this errs towards asking for windows.
    layer_types = hf.get("layer_types") or ()
    windows = "sliding_attention" in layer_types or (
        bool(hf.get("sliding_window")) and hf.get("use_sliding_window") is not False
    )
    latent = hf.get("kv_lora_rank") is not None
    return AttentionNeeds(
        device,
        dtype,
        head_dim,
        logit_softcap=softcap,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        sliding_window=windows,
        latent_attention=latent,
        attention_sinks=attention_sinks,
        bidirectional_spans=bidirectional_spans,
    )


def largest_head_dim(hf: Mapping[str, Any]) -> int:
    """The widest attention head of any layer: `head_dim`, or where layers differ (Gemma 4's global layers) their
    `global_head_dim` or `per_layer_config` head sizes."""
    head_dims = [int(hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"]))]
    if hf.get("global_head_dim"):
        head_dims.append(int(hf["global_head_dim"]))
    per_layer = hf.get("per_layer_config") or {}
    head_dims += [int(entry["head_dim"]) for entry in per_layer.values() if "head_dim" in entry]
    return max(head_dims)


def detect_packages(device: str, registry: BackendRegistry = ATTENTION_REGISTRY) -> ProbedPackages:
    """Probes the optional packages of the backends that run on `device`, in `auto`'s order (importing them)."""
    auto_order = registry.auto_order(device)
    order = (*auto_order, *(name for name in registry.names if name not in auto_order))
    probed = [name for name in order if _needs_probing(registry.capabilities(name), device)]
    if not probed:
        return ProbedPackages()
    capability = torch.cuda.get_device_capability() if device == "cuda" else None
    found: dict[str, PackageRelease | str] = {}
    for name in probed:
        release, problems = choose_release(registry.capabilities(name).releases, capability)
        found[name] = release if release is not None else "; ".join(problems)
    return ProbedPackages(found)


def _needs_probing(capabilities: BackendCapabilities, device: str) -> bool:
    return bool(capabilities.releases) and device in capabilities.devices


def unusable_reason(
    name: str, needs: AttentionNeeds, packages: ProbedPackages, registry: BackendRegistry = ATTENTION_REGISTRY
) -> str | None:
    """Why backend `name` cannot serve this model on this device, or None when it can."""
    capabilities = registry.capabilities(name)
    if needs.kv_cache_dtype not in (None, needs.dtype) and not capabilities.other_kv_cache_dtype:
        readers = " or ".join(other for other in registry.names if registry.capabilities(other).other_kv_cache_dtype)
        return f"it keeps the KV cache in the model's dtype only (--kv-cache-dtype needs the {readers} backend)"
    if needs.device not in capabilities.devices:
        return f"{name} needs --device {' or '.join(capabilities.devices)}"
    return _model_problem(capabilities, needs) or _package_problem(name, capabilities, packages)


def _model_problem(capabilities: BackendCapabilities, needs: AttentionNeeds) -> str | None:
    kernel = capabilities.kernel
    dtype = str(needs.dtype).removeprefix("torch.")
    if capabilities.dtypes and dtype not in capabilities.dtypes:
        return f"{kernel} supports {' and '.join(capabilities.dtypes)}, not {dtype}"
    largest, multiple = capabilities.max_head_size, capabilities.head_size_multiple
    if (largest is not None and needs.head_dim > largest) or needs.head_dim % multiple:
        up_to = f" up to {largest}" if largest is not None else ""
        steps = f" in steps of {multiple}" if multiple > 1 else ""
        return f"{kernel} supports head sizes{up_to}{steps}, not {needs.head_dim}"
    return _feature_problem(capabilities, needs)


def _feature_problem(capabilities: BackendCapabilities, needs: AttentionNeeds) -> str | None:
    lacking = (
        (needs.logit_softcap and not capabilities.logit_softcap, "cannot apply attention logit softcapping"),
        (needs.sliding_window and not capabilities.sliding_window, "cannot apply sliding windows"),
        (needs.latent_attention and not capabilities.latent_attention, "has no multi-head latent attention (MLA) path"),
        (needs.attention_sinks and not capabilities.attention_sinks, "cannot add attention sinks"),
        (
            needs.bidirectional_spans and not capabilities.bidirectional_spans,
            "cannot let an image's positions attend to each other bidirectionally",
        ),
    )
    return next((f"{capabilities.kernel} {reason}" for missing, reason in lacking if missing), None)


def _package_problem(name: str, capabilities: BackendCapabilities, packages: ProbedPackages) -> str | None:
    if not capabilities.releases:
        return None
    found = packages.found.get(name)
    if found is None:
        modules = " or ".join(release.module for release in capabilities.releases)
        return f"{modules} was not probed"
    if isinstance(found, PackageRelease):
        return None
    return f"{found} ({capabilities.install_hint})" if capabilities.install_hint else found


def select_backend(
    requested: str, needs: AttentionNeeds, packages: ProbedPackages, registry: BackendRegistry = ATTENTION_REGISTRY
) -> BackendChoice:
    """`auto` picks the first usable backend for the device; a named backend that cannot run is an error."""
    if requested not in registry.choices:
        raise ConfigError(f"unknown attention backend {requested!r}; choose one of {', '.join(registry.choices)}")
    if requested != AUTO:
        reason = unusable_reason(requested, needs, packages, registry)
        if reason is not None:
            raise ConfigError(f"--attention-backend {requested} is unavailable: {reason}")
        return BackendChoice(requested)
    skipped: list[tuple[str, str]] = []
    for name in registry.auto_order(needs.device):
        reason = unusable_reason(name, needs, packages, registry) or _auto_problem(name, needs, packages, registry)
        if reason is None:
            return BackendChoice(name, tuple(skipped))
        skipped.append((name, reason))
    passed_over = "; ".join(f"{name}: {reason}" for name, reason in skipped)
    raise ConfigError(f"no attention backend serves this model on {needs.device} (passed over {passed_over})")


def _auto_problem(name: str, needs: AttentionNeeds, packages: ProbedPackages, registry: BackendRegistry) -> str | None:
    # A backend whose release pages fast at one size only is `auto`'s choice at that size alone: elsewhere the kernel
    # it names is faster (named, the backend serves every size its release reads).
    faster = registry.capabilities(name).auto_only_at_fast_pages_over
    release = packages.release(name)
    if faster is None or release is None:
        return None
    fast = release.pages.fast
    if fast is None:
        return f"{release.name} has no paged path faster than {faster} (--attention-backend {name} takes it)"
    if needs.block_size != fast:
        return (
            f"{release.name} loads pages with {release.pages.fast_loads} only at --block-size {fast}, not "
            f"{needs.block_size}; {faster} is faster at other sizes"
        )
    return None
