"""The gRPC stubs are generated at build time by the pinned grpcio-tools, and they import only under a grpcio at
least that version: the pin must not pass the grpcio uv.lock installs (an unpinned build took a newer grpcio-tools
from the index and every stub import failed)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_stub_generator_is_pinned_at_or_below_the_locked_grpcio() -> None:
    requires = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = [re.fullmatch(r"grpcio-tools==([\d.]+)", requirement) for requirement in requires]
    (tools,) = [pin.group(1) for pin in pins if pin is not None]
    locked = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    (grpcio,) = [package["version"] for package in locked if package["name"] == "grpcio"]
    assert _version(tools) <= _version(grpcio), (tools, grpcio)
