"""The KV block size: the user's --block-size, else flash-attn-4's TMA page where it serves the GPUs, else 256 for
a named flash backend on flash-attn 2, else 16: the page sizes every registered backend declares."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from tandem_launcher import attention_pages
from tandem_launcher.attention_pages import ReleaseProbe, choose_block_size, parse_capabilities, probe_release
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv, shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel
from tandem_server.interfaces.attention import (
    BackendCapabilities,
    BackendRegistry,
    PackageRelease,
    PageSizes,
    RegisteredBackend,
)
from tandem_server.interfaces.attention_registry import FLASH_ATTN_4

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))
HOPPER = "flash-attn-4 4.0.0 on compute capability 9.0"


def one_gpu() -> int:
    return 1


def no_gpu() -> int:
    return 0


def serves(reason: str | None) -> ReleaseProbe:
    """flash-attn-4 serves the GPUs for `reason`, or not at all for None."""

    def probe(release: PackageRelease) -> str | None:
        assert release == FLASH_ATTN_4, "only a release with a fast page size is probed"
        return reason

    return probe


@pytest.mark.parametrize(
    ("argv", "environ", "flash_attn_4", "expected", "reason"),
    [
        ([], {}, None, 16, "the default (flash-attn-4 does not serve these GPUs"),
        ([], {}, HOPPER, 128, f"{HOPPER} loads pages of 128 tokens with TMA"),
        (["--attention-backend", "triton"], {}, HOPPER, 16, "the default"),
        (["--attention-backend", "flash"], {}, HOPPER, 128, HOPPER),
        (["--attention-backend", "flash"], {}, None, 256, "--attention-backend flash pages the KV cache in multiples"),
        ([], {"ATTENTION_BACKEND": "flash"}, None, 256, "--attention-backend flash"),
        (["--attention-backend", "flash", "--block-size", "512"], {}, HOPPER, 512, "--block-size"),
        (["--attention-backend", "flash"], {"BLOCK_SIZE": "32"}, HOPPER, 32, "--block-size"),
        (["--device", "cpu"], {}, HOPPER, 16, "the default"),
    ],
)
def test_block_size_follows_the_attention_backend_the_shards_will_take_unless_set(
    argv: list[str], environ: dict[str, str], flash_attn_4: str | None, expected: int, reason: str
) -> None:
    config = parse_config(argv, environ, count_gpus=one_gpu, release_probe=serves(flash_attn_4))
    assert config.block_size == expected
    assert config.block_size_reason.startswith(reason)


def test_a_machine_without_gpus_never_probes_flash_attn_4() -> None:
    def probe(release: PackageRelease) -> str | None:
        raise AssertionError(f"probed {release.name} for a CPU launch")

    assert parse_config([], {}, count_gpus=no_gpu, release_probe=probe).block_size == 16


def test_router_and_shards_page_with_the_chosen_block_size() -> None:
    parsed = parse_config([], {}, count_gpus=one_gpu, release_probe=serves(HOPPER))
    config = LauncherConfig(**{**parsed.__dict__, "commands": COMMANDS})
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    argv = router_argv(config, model, TokenLimits(max_input_tokens=100, max_total_tokens=200), [Path("/s")])
    assert argv[argv.index("--block-size") + 1] == "128"
    shard = shard_argv(config, model, 0, Path("/s"), 29500)
    assert shard[shard.index("--block-size") + 1] == "128"


FAST_PAGES = PackageRelease("fastattn", "fastattn", distribution="fastattn", pages=PageSizes(fast=64, fast_loads="TMA"))
WIDE_PAGES = PackageRelease("wideattn", "wideattn", distribution="wideattn", pages=PageSizes(multiple=96))
# A registered backend `auto` tries first on CUDA, at its fast page size only, then one that pages in multiples of 96.
REGISTRY = BackendRegistry(
    (
        RegisteredBackend(
            "fast",
            "fast:Backend",
            BackendCapabilities(
                kernel="the fast kernel",
                devices=("cuda",),
                releases=(FAST_PAGES,),
                auto_priority={"cuda": 1},
                auto_only_at_fast_pages_over="the wide kernel",
            ),
        ),
        RegisteredBackend(
            "wide",
            "wide:Backend",
            BackendCapabilities(
                kernel="the wide kernel", devices=("cuda",), releases=(WIDE_PAGES,), auto_priority={"cuda": 2}
            ),
        ),
    )
)


@pytest.mark.parametrize(
    ("backend", "serving", "expected", "reason"),
    [
        ("auto", "fastattn on compute capability 9.0", 64, "fastattn on compute capability 9.0 loads pages of 64"),
        ("auto", None, 96, "wide pages the KV cache in multiples of 96"),
        ("wide", None, 96, "--attention-backend wide pages the KV cache in multiples of 96"),
        ("fast", None, 16, "the default"),
    ],
)
def test_block_size_follows_whatever_backends_are_registered(
    backend: str, serving: str | None, expected: int, reason: str
) -> None:
    def probe(release: PackageRelease) -> str | None:
        assert release == FAST_PAGES, "only a release with a fast page size is probed"
        return serving

    block_size, why = choose_block_size(None, backend, "cuda", probe, REGISTRY)
    assert (block_size, why[: len(reason)]) == (expected, reason)


@pytest.mark.parametrize(
    ("installed", "nvidia_smi", "expected"),
    [
        (True, "9.0\n9.0\n", "flash-attn-4 4.0.0b36 on compute capability 9.0"),
        (True, "10.0\n9.0\n", "flash-attn-4 4.0.0b36 on compute capability 10.0, 9.0"),
        # One GPU without flash-attn-4 kernels: every shard must page alike, so none takes its pages.
        (True, "9.0\n8.9\n", None),
        (True, "8.0\n", None),
        (True, None, None),
        (True, "No devices were found\n", None),
        (False, "9.0\n", None),
    ],
)
def test_flash_attn_4_serves_only_where_it_is_installed_and_every_gpu_has_kernels(
    monkeypatch: pytest.MonkeyPatch, installed: bool, nvidia_smi: str | None, expected: str | None
) -> None:
    def version(name: str) -> str:
        assert name == "flash-attn-4"
        if not installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return "4.0.0b36"

    monkeypatch.setattr(attention_pages.importlib.metadata, "version", version)
    commands: list[list[str]] = []

    def run(command: list[str]) -> str | None:
        commands.append(command)
        return nvidia_smi

    assert probe_release(FLASH_ATTN_4, run) == expected
    assert commands in ([], [["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]])


def test_capabilities_are_read_from_nvidia_smi_lines_alone() -> None:
    assert parse_capabilities("9.0\n 8.9 \n\nN/A\n[Not Supported]\n") == ["9.0", "8.9"]
