"""What the GPU machine gets: the bundle's Python and flash-attn-4, the check's site per Python, a C compiler in
the CUDA image (Triton compiles a launcher at a kernel's first launch)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bundle_defaults_to_python_3_12_and_carries_flash_attn_4() -> None:
    script = (REPO / "scripts" / "gpu_check_bundle.sh").read_text()
    assert "PYTHON_VERSIONS=${GPU_CHECK_PYTHON_VERSIONS:-${GPU_CHECK_PYTHON_VERSION:-3.12}}" in script
    assert "flash-attn-4==" in script and "nvidia-cutlass-dsl==" in script
    assert "for python_version in $PYTHON_VERSIONS; do" in script


def test_check_puts_the_running_pythons_packages_on_the_path() -> None:
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert 'SITES="$BUNDLE/site-$python_version:$BUNDLE/flash-site-$python_version"' in script
    assert '"$BUNDLE/flash-attn-4.tar.xz"' in script


def test_cuda_runtime_stage_has_a_c_compiler() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    runtime_stage = dockerfile.split("FROM ${CUDA_RUNTIME_IMAGE}", 1)[1]
    assert re.search(r"apt-get install[^\n]*\bgcc\b", runtime_stage)
