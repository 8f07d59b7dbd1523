"""The attention backend is chosen once from device, installed packages and model features; bad requests fail."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tandem_server.errors import ConfigError
from tandem_server.interfaces import attention as interface
from tandem_server.interfaces.attention import PackageRelease, choose_release
from tandem_server.interfaces.attention_registry import FLASH_ATTN_2, FLASH_ATTN_4, FLASH_CAPABILITIES, TRITON
from tandem_server.layers.attention import create_backend
from tandem_server.layers.attention.selection import (
    AttentionNeeds,
    ProbedPackages,
    detect_packages,
    needs_from_hf_config,
    select_backend,
)

NO_FLASH_ATTN = "flash_attn is not importable (No module named 'flash_attn')"
BOTH_INSTALLED = ProbedPackages({"flash": FLASH_ATTN_4, "triton": TRITON})
NO_FLASH = ProbedPackages({"flash": NO_FLASH_ATTN, "triton": TRITON})
NEITHER = ProbedPackages({"flash": NO_FLASH_ATTN, "triton": "triton is not importable (No module named 'triton')"})
CUDA_BF16 = AttentionNeeds("cuda", torch.bfloat16, head_dim=128)
# Pages of flash-attn-4's TMA size, as the launcher picks them when flash-attn-4 serves the GPU.
CUDA_BF16_TMA_PAGES = AttentionNeeds("cuda", torch.bfloat16, head_dim=128, block_size=128)


def test_auto_on_cpu_is_torch_without_probing_packages() -> None:
    needs = AttentionNeeds("cpu", torch.float32, head_dim=64)
    assert select_backend("auto", needs, detect_packages("cpu")).name == "torch"


@pytest.mark.parametrize(
    ("packages", "needs", "expected"),
    [
        (BOTH_INSTALLED, CUDA_BF16_TMA_PAGES, "flash"),
        (BOTH_INSTALLED, CUDA_BF16, "triton"),
        (NO_FLASH, CUDA_BF16_TMA_PAGES, "triton"),
        (NEITHER, CUDA_BF16, "sdpa"),
        (NEITHER, AttentionNeeds("cuda", torch.bfloat16, 256, logit_softcap=True), "torch"),
        # flash-attn has no float32 kernels and no head size above 256.
        (BOTH_INSTALLED, AttentionNeeds("cuda", torch.float32, 128, block_size=128), "triton"),
        # Neither flash-attn nor the Triton kernel serves head sizes above 256.
        (BOTH_INSTALLED, AttentionNeeds("cuda", torch.bfloat16, 512, block_size=128), "sdpa"),
    ],
)
def test_auto_on_cuda_takes_the_first_usable_of_flash_triton_sdpa_torch(
    packages: ProbedPackages, needs: AttentionNeeds, expected: str
) -> None:
    assert select_backend("auto", needs, packages).name == expected


def test_auto_choice_explains_what_it_passed_over() -> None:
    choice = select_backend("auto", CUDA_BF16, NEITHER)
    assert choice.name == "sdpa"
    assert "flash: flash_attn is not importable" in choice.describe()
    assert "pip install 'tandem-server[cuda]'" in choice.describe()
    assert "triton: triton is not importable" in choice.describe()


@pytest.mark.parametrize(
    ("requested", "needs", "packages", "message"),
    [
        ("flash", AttentionNeeds("cpu", torch.float32, 64), BOTH_INSTALLED, "flash needs --device cuda"),
        ("triton", AttentionNeeds("cpu", torch.float32, 64), BOTH_INSTALLED, "triton needs --device cuda"),
        ("flash", CUDA_BF16, NO_FLASH, "flash_attn is not importable"),
        ("triton", CUDA_BF16, NEITHER, "triton is not importable"),
        ("flash", AttentionNeeds("cuda", torch.float32, 64), BOTH_INSTALLED, "float16 and bfloat16, not float32"),
        ("sdpa", AttentionNeeds("cpu", torch.float32, 64, logit_softcap=True), BOTH_INSTALLED, "softcapping"),
        ("sdpa", AttentionNeeds("cpu", torch.float32, 64, attention_sinks=True), BOTH_INSTALLED, "attention sinks"),
        ("flash", replace(CUDA_BF16_TMA_PAGES, attention_sinks=True), BOTH_INSTALLED, "flash-attn cannot add"),
        ("sdpa", AttentionNeeds("cpu", torch.float32, 64, bidirectional_spans=True), BOTH_INSTALLED, "bidirectional"),
        ("triton", replace(CUDA_BF16, bidirectional_spans=True), BOTH_INSTALLED, "Triton kernel cannot let an image"),
        ("flashy", CUDA_BF16, BOTH_INSTALLED, "unknown attention backend 'flashy'"),
    ],
)
def test_a_requested_backend_that_cannot_run_is_a_startup_error(
    requested: str, needs: AttentionNeeds, packages: ProbedPackages, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        select_backend(requested, needs, packages)


@pytest.mark.parametrize("name", ["torch", "sdpa"])
def test_cpu_backends_are_chosen_when_asked(name: str) -> None:
    choice = select_backend(name, AttentionNeeds("cpu", torch.float32, 64), detect_packages("cpu"))
    assert choice.name == name and create_backend(name).name == name


def test_missing_package_is_reported_with_the_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []

    def import_module(name: str) -> object:
        imported.append(name)
        if name.startswith("flash_attn"):
            raise ImportError(f"No module named {name!r}")
        return object()

    monkeypatch.setattr(interface.importlib, "import_module", import_module)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    problems = detect_packages("cuda")
    assert problems.found["flash"] == (
        "flash_attn.cute is not importable (No module named 'flash_attn.cute'); "
        "flash_attn is not importable (No module named 'flash_attn')"
    )
    assert problems.release("triton") == TRITON and problems.release("flash") is None
    assert imported == ["flash_attn.cute", "flash_attn", "triton"]
    assert select_backend("auto", CUDA_BF16, problems).name == "triton"


class VarlenModule:
    """What an installed FlashAttention release's module offers the backend."""

    @staticmethod
    def flash_attn_varlen_func() -> None:
        raise AssertionError("selection never calls the kernel")


@pytest.mark.parametrize(
    ("installed", "capability", "release"),
    [
        # flash-attn-4 has kernels for Hopper and Blackwell only; flash-attn 2 from Ampere on.
        ({"flash_attn.cute", "flash_attn"}, (9, 0), FLASH_ATTN_4),
        ({"flash_attn.cute", "flash_attn"}, (10, 0), FLASH_ATTN_4),
        ({"flash_attn.cute", "flash_attn"}, (8, 0), FLASH_ATTN_2),
        ({"flash_attn.cute"}, (8, 9), None),
        ({"flash_attn"}, (9, 0), FLASH_ATTN_2),
    ],
)
def test_the_flash_backend_drives_the_newest_release_with_kernels_for_the_gpu(
    monkeypatch: pytest.MonkeyPatch, installed: set[str], capability: tuple[int, int], release: PackageRelease | None
) -> None:
    def import_module(name: str) -> object:
        if name not in installed:
            raise ImportError(f"No module named {name!r}")
        return VarlenModule

    monkeypatch.setattr(interface.importlib, "import_module", import_module)
    chosen, problems = choose_release(FLASH_CAPABILITIES.releases, capability)
    assert chosen == release
    if release is None:
        assert problems[0] == "flash-attn-4 has no kernels for compute capability 8.9"


FA2_ONLY = ProbedPackages({"flash": FLASH_ATTN_2, "triton": TRITON})
FA4 = ProbedPackages({"flash": FLASH_ATTN_4, "triton": TRITON})


def test_auto_passes_over_flash_attn_2_for_the_triton_kernel() -> None:
    choice = select_backend("auto", CUDA_BF16_TMA_PAGES, FA2_ONLY)
    assert choice.name == "triton"
    assert "flash: flash-attn 2 has no paged path faster than the Triton kernel" in choice.describe()
    # Named, it is taken: the launcher then picks 256-token blocks.
    assert select_backend("flash", CUDA_BF16, FA2_ONLY).name == "flash"


@pytest.mark.parametrize("block_size", [None, 16, 256])
def test_auto_takes_flash_attn_4_only_at_its_tma_page_size(block_size: int | None) -> None:
    assert select_backend("auto", CUDA_BF16_TMA_PAGES, FA4).name == "flash"
    choice = select_backend("auto", replace(CUDA_BF16, block_size=block_size), FA4)
    assert choice.name == "triton"
    assert f"flash-attn-4 loads pages with TMA only at --block-size 128, not {block_size}" in choice.describe()
    # Named, flash-attn-4 serves any block size, on its slower path.
    assert select_backend("flash", replace(CUDA_BF16, block_size=block_size), FA4).name == "flash"


def test_model_features_come_from_config_json() -> None:
    gemma = {"hidden_size": 640, "num_attention_heads": 4, "head_dim": 256, "attn_logit_softcapping": 50.0}
    gemma |= {"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}
    needs = needs_from_hf_config(gemma, "cuda", torch.bfloat16)
    assert (needs.head_dim, needs.logit_softcap, needs.sliding_window) == (256, True, True)
    qwen = {"hidden_size": 896, "num_attention_heads": 14, "sliding_window": 4096, "use_sliding_window": False}
    needs = needs_from_hf_config(qwen, "cpu", torch.float32)
    assert (needs.head_dim, needs.logit_softcap, needs.sliding_window) == (64, False, False)
    mistral = {"hidden_size": 4096, "num_attention_heads": 32, "sliding_window": 4096}
    assert needs_from_hf_config(mistral, "cuda", torch.bfloat16).sliding_window


def test_the_widest_head_of_any_layer_decides_gemma4s_head_size() -> None:
    gemma4 = {"hidden_size": 1536, "num_attention_heads": 8, "head_dim": 256, "global_head_dim": 512}
    assert needs_from_hf_config(gemma4, "cuda", torch.bfloat16).head_dim == 512
    saved = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "per_layer_config": {"5": {"head_dim": 32}}}
    assert needs_from_hf_config(saved, "cpu", torch.float32).head_dim == 32


def test_a_model_with_attention_sinks_gets_only_a_backend_that_adds_them() -> None:
    sinks = replace(CUDA_BF16_TMA_PAGES, attention_sinks=True)
    choice = select_backend("auto", sinks, BOTH_INSTALLED)
    assert choice.name == "triton"
    assert "flash: flash-attn cannot add attention sinks" in choice.describe()
    # Without Triton, torch SDPA is passed over too.
    assert select_backend("auto", sinks, NEITHER).name == "torch"
    assert select_backend("auto", replace(sinks, device="cpu"), detect_packages("cpu")).name == "torch"


def test_a_model_whose_image_spans_attend_bidirectionally_gets_the_torch_backend() -> None:
    spans = replace(CUDA_BF16_TMA_PAGES, bidirectional_spans=True)
    choice = select_backend("auto", spans, BOTH_INSTALLED)
    assert choice.name == "torch"
    assert "flash: flash-attn cannot let an image's positions attend to each other bidirectionally" in choice.describe()
    assert "sdpa: torch SDPA cannot let an image's positions" in choice.describe()
    assert select_backend("auto", replace(spans, device="cpu"), detect_packages("cpu")).name == "torch"
    assert needs_from_hf_config({"head_dim": 16}, "cpu", torch.float32, bidirectional_spans=True).bidirectional_spans
