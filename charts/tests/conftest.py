"""Shared fixtures of the chart checks: the helm binary and each value set rendered once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helm import VALUE_SETS, helm_binary, render


@pytest.fixture(scope="session")
def helm() -> str:
    return helm_binary()


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, name) for name in VALUE_SETS}
