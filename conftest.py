"""Test tiers: `e2e` (the real stack booted through the launcher, or a rendered Helm pod) is every test under
`integration-tests/` and `charts/tests/`; `slow` is marked in the unit suites; the rest is the unit tier that
`make test-fast` runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
END_TO_END_DIRS = (ROOT / "integration-tests", ROOT / "charts" / "tests")


def pytest_configure(config: pytest.Config) -> None:
    """transformers runs fla's kernels for Qwen3.5's and Qwen3-Next's delta rule whenever fla imports, whatever the
    tensors' device, and fla's kernels need a GPU or Triton's interpreter: without either, `import fla` fails, so the
    reference models run their torch forms (Tandem imports fla only for CUDA tensors)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        sys.modules.setdefault("fla", None)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(directory) for directory in END_TO_END_DIRS):
            item.add_marker(pytest.mark.e2e)
