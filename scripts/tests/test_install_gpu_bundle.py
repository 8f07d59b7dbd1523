"""What scripts/gpu_check_bundle.sh carries to the GPU machine: CUDA 13 packages pinned as in uv.lock, and nothing
that would shadow the machine's own torch."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[2]
BUNDLE_SCRIPT = REPO / "scripts" / "gpu_check_bundle.sh"


def bundle_script() -> str:
    return BUNDLE_SCRIPT.read_text()


def pinned_array(name: str) -> dict[str, str]:
    """`NAME=(a==1 b==2 ...)` of the bundle script as {package: version}."""
    match = re.search(rf"^{name}=\((.*?)\)", bundle_script(), re.MULTILINE | re.DOTALL)
    assert match, f"{BUNDLE_SCRIPT.name} defines no {name} array"
    pins = dict(pin.split("==") for pin in match.group(1).split())
    return {package.lower(): version for package, version in pins.items()}


def site_packages() -> list[str]:
    """The packages the bundle copies from the synced environment into every site folder."""
    match = re.search(r"^for name in (.*?); do$", bundle_script(), re.MULTILINE | re.DOTALL)
    assert match, f"{BUNDLE_SCRIPT.name} lists no packages of the synced environment"
    return match.group(1).replace("\\\n", " ").split()


def bundle_python() -> str:
    """The Python the bundle is built for unless GPU_CHECK_PYTHON_VERSIONS names others."""
    match = re.search(r"^PYTHON_VERSIONS=.*:-(\d+\.\d+)\}+$", bundle_script(), re.MULTILINE)
    assert match, f"{BUNDLE_SCRIPT.name} names no default Python"
    return match.group(1)


@functools.cache
def lock() -> dict[str, Any]:
    return tomllib.loads((REPO / "uv.lock").read_text())


def locked_version(name: str, python: str) -> str:
    """The version uv.lock installs of `name` on Linux x86_64 under `python`."""
    environment = {
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
    }
    versions = [
        package["version"]
        for package in lock()["package"]
        if package["name"] == name
        and (
            "resolution-markers" not in package
            or any(Marker(marker).evaluate(environment) for marker in package["resolution-markers"])
        )
    ]
    assert len(versions) == 1, f"uv.lock has {versions or 'no version'} of {name} for Python {python}"
    return versions[0]


def all_bundled() -> list[str]:
    return [*site_packages(), *pinned_array("FLASH_PACKAGES"), *pinned_array("CUDA_BINDINGS_PACKAGES")]


def test_bundle_carries_no_cuda_12_package() -> None:
    assert [name for name in all_bundled() if re.search(r"-cu12\b", name)] == []
    assert "nvidia-cutlass-dsl-libs-cu13" in pinned_array("FLASH_PACKAGES")


def test_bundle_carries_nothing_of_the_machines_torch() -> None:
    shadowing = [
        name
        for name in all_bundled()
        if name in ("torch", "triton") or (name.startswith("nvidia-") and not name.startswith("nvidia-cutlass-dsl"))
    ]
    assert shadowing == []


def test_cuda_bindings_stay_out_of_the_sites_that_precede_the_machines_packages() -> None:
    # torch brings cuda-bindings and cuda-pathfinder; gpu_check.sh adds the bundle's copies only where it did not.
    assert set(pinned_array("CUDA_BINDINGS_PACKAGES")) == {"cuda-bindings", "cuda-pathfinder"}
    assert not {"cuda-bindings", "cuda-pathfinder"} & {*site_packages(), *pinned_array("FLASH_PACKAGES")}


def test_flash_packages_are_the_versions_uv_lock_installs() -> None:
    python = bundle_python()
    pinned = {**pinned_array("FLASH_PACKAGES"), **pinned_array("CUDA_BINDINGS_PACKAGES")}
    assert "flash-attn-4" in pinned
    assert {name: locked_version(name, python) for name in pinned} == pinned
