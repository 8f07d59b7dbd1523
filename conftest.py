"""Test tiers: `e2e` (the real stack booted through the launcher, or a rendered Helm pod) is every test under
`integration-tests/` and `charts/tests/`; `slow` is marked in the unit suites; the rest is the unit tier that
`make test-fast` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
END_TO_END_DIRS = (ROOT / "integration-tests", ROOT / "charts" / "tests")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(directory) for directory in END_TO_END_DIRS):
            item.add_marker(pytest.mark.e2e)
