"""Attention backends are registered with their capabilities; selection checks a model against them, whatever the
backend, and `auto` follows their priorities."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch
from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention import (
    BackendCapabilities,
    BackendRegistry,
    BackendSettings,
    PackageRelease,
    PageSizes,
    RegisteredBackend,
)
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY
from tandem_server.layers.attention import SdpaAttentionBackend, TorchAttentionBackend, create_backend
from tandem_server.layers.attention.selection import (
    AttentionNeeds,
    ProbedPackages,
    select_backend,
    unusable_reason,
)

TORCH = ATTENTION_REGISTRY.entry("torch")
FAKE_RELEASE = PackageRelease("fakeattn 1", "fakeattn", distribution="fakeattn", pages=PageSizes(multiple=64))
# A CUDA-only kernel narrower than any real one: half precision, head sizes up to 128 in steps of 16, no softcap, no
# sliding windows, and a package of its own; `auto` tries it first on CUDA.
FAKE_CAPABILITIES = BackendCapabilities(
    kernel="the fake kernel",
    devices=("cuda",),
    dtypes=("float16", "bfloat16"),
    max_head_size=128,
    head_size_multiple=16,
    logit_softcap=False,
    sliding_window=False,
    releases=(FAKE_RELEASE,),
    install_hint="pip install fakeattn",
    auto_priority={"cuda": 5},
)
# Built as the sdpa backend: registering needs only a module path, which is imported when the backend is built.
FAKE = RegisteredBackend("fake", "tandem_server.layers.attention.sdpa_backend:SdpaAttentionBackend", FAKE_CAPABILITIES)
REGISTRY = BackendRegistry((TORCH, FAKE))
INSTALLED = ProbedPackages({"fake": FAKE_RELEASE})
CUDA_HALF = AttentionNeeds("cuda", torch.float16, head_dim=64)


@pytest.mark.parametrize("name", ATTENTION_REGISTRY.names)
def test_every_registered_backend_class_declares_the_capabilities_it_is_registered_with(name: str) -> None:
    entry = ATTENTION_REGISTRY.entry(name)
    backend_class: Any = entry.load_class()
    assert backend_class.capabilities is entry.capabilities
    assert backend_class.name == name
    assert backend_class.supports_cuda_graphs == entry.capabilities.cuda_graphs
    assert entry.capabilities.devices, "a backend runs on some device"
    assert set(entry.capabilities.auto_priority) <= set(entry.capabilities.devices)


def test_the_registry_imports_without_torch_or_any_kernel_package() -> None:
    # The launcher reads the registry; a fresh interpreter shows what importing it costs.
    program = (
        "import json, sys\n"
        "from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY\n"
        "print(json.dumps(sorted(m for m in ('torch', 'triton', 'flash_attn') if m in sys.modules)))\n"
    )
    finished = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == []


def test_choices_and_auto_order_come_from_the_registry() -> None:
    assert ATTENTION_REGISTRY.choices == ("auto", "torch", "sdpa", "triton", "flash")
    assert ATTENTION_REGISTRY.auto_order("cuda") == ("flash", "triton", "sdpa", "torch")
    assert ATTENTION_REGISTRY.auto_order("cpu") == ("torch",)
    assert ATTENTION_REGISTRY.describe_auto() == "the first usable of flash, triton, sdpa, torch on CUDA, torch on CPU"
    assert REGISTRY.auto_order("cuda") == ("fake", "torch")


def test_an_unknown_backend_is_a_configuration_error_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown attention backend 'nope'; available: torch, fake"):
        REGISTRY.capabilities("nope")
    with pytest.raises(ConfigError, match=r"unknown attention backend 'nope'; choose one of auto, torch, fake"):
        select_backend("nope", CUDA_HALF, INSTALLED, REGISTRY)
    with pytest.raises(ConfigError, match="unknown attention backend 'nope'"):
        create_backend("nope")


@pytest.mark.parametrize("name", ["auto", "torch"])
def test_backend_names_are_unique_and_never_auto(name: str) -> None:
    renamed = RegisteredBackend(name, TORCH.factory, TORCH.capabilities)
    with pytest.raises(ValueError, match="unique"):
        BackendRegistry((TORCH, renamed) if name == "torch" else (renamed,))


def test_auto_takes_a_registered_backend_first_when_it_is_usable() -> None:
    choice = select_backend("auto", CUDA_HALF, INSTALLED, REGISTRY)
    assert choice.name == "fake" and choice.skipped == ()
    assert select_backend("auto", AttentionNeeds("cpu", torch.float32, 64), ProbedPackages(), REGISTRY).name == "torch"


@pytest.mark.parametrize(
    ("needs", "packages", "reason"),
    [
        (AttentionNeeds("cpu", torch.float16, 64), INSTALLED, "fake needs --device cuda"),
        (
            AttentionNeeds("cuda", torch.float32, 64),
            INSTALLED,
            "the fake kernel supports float16 and bfloat16, not float32",
        ),
        (AttentionNeeds("cuda", torch.float16, 256), INSTALLED, "head sizes up to 128 in steps of 16, not 256"),
        (AttentionNeeds("cuda", torch.float16, 72), INSTALLED, "head sizes up to 128 in steps of 16, not 72"),
        (AttentionNeeds("cuda", torch.float16, 64, logit_softcap=True), INSTALLED, "cannot apply attention logit soft"),
        (AttentionNeeds("cuda", torch.float16, 64, sliding_window=True), INSTALLED, "cannot apply sliding windows"),
        (
            AttentionNeeds("cuda", torch.float16, 64, kv_cache_dtype=torch.float32),
            INSTALLED,
            "it keeps the KV cache in the model's dtype only (--kv-cache-dtype needs the torch backend)",
        ),
        (CUDA_HALF, ProbedPackages({"fake": "fakeattn is not importable"}), "fakeattn is not importable (pip install"),
        (CUDA_HALF, ProbedPackages(), "fakeattn was not probed"),
    ],
)
def test_a_backend_the_model_asks_more_of_is_passed_over_with_the_reason(
    needs: AttentionNeeds, packages: ProbedPackages, reason: str
) -> None:
    found = unusable_reason("fake", needs, packages, REGISTRY)
    assert found is not None and reason in found
    if needs.device == "cuda":
        choice = select_backend("auto", needs, packages, REGISTRY)
        assert choice.name == "torch" and choice.skipped == (("fake", found),)
    with pytest.raises(ConfigError, match=r"--attention-backend fake is unavailable"):
        select_backend("fake", needs, packages, REGISTRY)


def test_auto_without_a_usable_backend_says_what_it_passed_over() -> None:
    only_fake = BackendRegistry((FAKE,))
    with pytest.raises(ConfigError, match=r"no attention backend serves this model on cuda \(passed over fake: "):
        select_backend("auto", AttentionNeeds("cuda", torch.float32, 64), INSTALLED, only_fake)


def test_a_backend_is_built_from_its_registered_class_with_the_shards_settings() -> None:
    assert isinstance(REGISTRY.create("fake", BackendSettings()), SdpaAttentionBackend)
    torch_backend = REGISTRY.create("torch", BackendSettings(decode_mirror_memory=1 << 20))
    assert isinstance(torch_backend, TorchAttentionBackend) and torch_backend.decode_mirror_memory == 1 << 20


def test_the_backends_keeping_another_kv_cache_dtype_are_read_from_their_capabilities() -> None:
    assert ATTENTION_REGISTRY.names_with(lambda capabilities: capabilities.other_kv_cache_dtype) == ("torch",)
    assert ATTENTION_REGISTRY.names_with(lambda capabilities: capabilities.cuda_graphs) == ("triton", "flash")
