"""scripts/gpu_check.sh on a stand-in Python: which attention backends it sweeps and which bundle folders it puts on
PYTHONPATH, decided by what imports on the GPU machine."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Answers the script's probes the way a GPU machine would; `-m` prints what the check would have been started with.
STAND_IN_PYTHON = """#!/bin/bash
case "$1" in
  -c)
    case "$2" in
      *flash_attn.cute*) [ -n "$HAS_FLASH" ] && exit 0
                         echo "Traceback (most recent call last):" >&2
                         echo "ModuleNotFoundError: No module named 'flash_attn'" >&2; exit 1;;
      *cuda.bindings*) [ -n "$HAS_CUDA_BINDINGS" ] && exit 0; exit 1;;
      *version_info*) echo 3.12;;
    esac;;
  -) cat >/dev/null;;
  -m) shift 2; echo "ARGS $*"; echo "PYTHONPATH $PYTHONPATH";;
esac
"""


def run_gpu_check(
    tmp_path: Path, *args: str, has_flash: bool, has_cuda_bindings: bool
) -> subprocess.CompletedProcess[str]:
    """Runs a copy of the script in an empty tree under `tmp_path`, so no real bundle is touched."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_check.sh", tmp_path / "scripts" / "gpu_check.sh")
    python = tmp_path / "python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    environ = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HAS_FLASH", "HAS_CUDA_BINDINGS")
    }
    environ |= {"PYTHON": str(python)}
    environ |= {"HAS_FLASH": "1"} if has_flash else {}
    environ |= {"HAS_CUDA_BINDINGS": "1"} if has_cuda_bindings else {}
    command = ["bash", str(tmp_path / "scripts" / "gpu_check.sh"), *args]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60, check=True)


def started_with(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    return next(line.removeprefix(prefix) for line in result.stdout.splitlines() if line.startswith(prefix))


def test_both_backends_are_swept_when_flash_attn_4_imports(tmp_path: Path) -> None:
    result = run_gpu_check(tmp_path, "--no-fp8", has_flash=True, has_cuda_bindings=True)
    assert started_with(result, "ARGS ") == "--attention-backends triton flash --no-fp8"
    assert "skipping the flash backend" not in result.stderr


def test_flash_is_skipped_with_the_import_error_when_flash_attn_4_does_not_import(tmp_path: Path) -> None:
    result = run_gpu_check(tmp_path, has_flash=False, has_cuda_bindings=True)
    assert started_with(result, "ARGS ") == "--attention-backends triton"
    assert (
        "skipping the flash backend: flash-attn-4 does not import "
        "(ModuleNotFoundError: No module named 'flash_attn')" in result.stderr
    )


def test_bundled_cuda_bindings_join_only_where_the_machine_has_none(tmp_path: Path) -> None:
    with_machines = run_gpu_check(tmp_path / "a", has_flash=True, has_cuda_bindings=True)
    without = run_gpu_check(tmp_path / "b", has_flash=True, has_cuda_bindings=False)
    assert "cuda-bindings-site" not in started_with(with_machines, "PYTHONPATH ")
    assert started_with(without, "PYTHONPATH ").endswith("/.gpu-check/cuda-bindings-site-3.12")


def test_cute_dsl_packages_join_pythonpath_as_their_pth_file_would(tmp_path: Path) -> None:
    # flash_attn.cute imports `cutlass`, which only nvidia_cutlass_dsl_packages.pth puts on sys.path.
    result = run_gpu_check(tmp_path, has_flash=True, has_cuda_bindings=True)
    expected = str(tmp_path / ".gpu-check" / "flash-site-3.12" / "nvidia_cutlass_dsl" / "dsl_packages")
    assert expected in started_with(result, "PYTHONPATH ").split(":")
