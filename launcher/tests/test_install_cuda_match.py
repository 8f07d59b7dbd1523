"""The CUDA image of the Dockerfile matches the CUDA of the torch that uv.lock installs into it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[2]
_IMAGE = re.compile(r"^ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-ubuntu\d+\.\d+$", re.MULTILINE)
# torch's CUDA libraries are named for their CUDA major: nvidia-cudnn-cu13, nvidia-nccl-cu13, ...
_CUDA_SUFFIX = re.compile(r"^nvidia-.+-cu(\d+)$")


def image_cuda() -> tuple[int, int]:
    """(major, minor) of the CUDA runtime image the Dockerfile's final stage starts from."""
    dockerfile = (REPO / "Dockerfile").read_text()
    match = _IMAGE.search(dockerfile)
    assert match, "the Dockerfile names no nvidia/cuda runtime image in ARG CUDA_RUNTIME_IMAGE"
    assert "FROM ${CUDA_RUNTIME_IMAGE}" in dockerfile
    return int(match.group(1)), int(match.group(2))


def locked_packages(name: str) -> list[dict[str, Any]]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return [package for package in lock["package"] if package["name"] == name]


def torch_cuda_majors() -> dict[str, set[int]]:
    """For each locked torch version, the CUDA majors its Linux CUDA libraries are built for."""
    majors = {}
    for torch in locked_packages("torch"):
        names = [dependency["name"] for dependency in torch.get("dependencies", [])]
        majors[torch["version"]] = {int(match.group(1)) for name in names if (match := _CUDA_SUFFIX.match(name))}
    return majors


def cuda_runtime_majors() -> set[int]:
    """The CUDA majors of every locked nvidia-cuda-runtime, the libcudart torch loads."""
    return {int(package["version"].split(".")[0]) for package in locked_packages("nvidia-cuda-runtime")}


def test_runtime_image_has_the_cuda_major_of_the_locked_torch() -> None:
    image_major, _ = image_cuda()
    majors = torch_cuda_majors()
    assert majors, "uv.lock holds no torch"
    for version, torch_majors in majors.items():
        assert torch_majors == {image_major}, f"torch {version} needs CUDA {torch_majors}, the image has {image_major}"
    assert cuda_runtime_majors() == {image_major}


def test_runtime_image_asks_only_for_the_oldest_driver_of_its_cuda_major() -> None:
    # The image's NVIDIA_REQUIRE_CUDA makes the container runtime refuse drivers older than the image's CUDA, while
    # torch's wheels of CUDA 13.x run on any driver of CUDA 13.0 (minor version compatibility): an image of a later
    # minor would turn away drivers that the wheels run on.
    _, image_minor = image_cuda()
    assert image_minor == 0
