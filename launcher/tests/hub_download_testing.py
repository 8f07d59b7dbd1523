"""What the download tests share: a Hub stand-in with their repos, and `tandem-launcher download` run in a child with
its own HF_HOME and HF_ENDPOINT."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hub_standin import HubStandin
from hub_standin_repos import StandinRepo, synthetic_repo

GOOD_TOKEN = "hf_good_token"
NO_ACCESS_TOKEN = "hf_token_without_access"
SERVED = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
# Variables of the machine running the tests that would change what the child does.
HUB_VARIABLES = ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH", "MODEL_ID")


@contextmanager
def standin_with_repos() -> Iterator[HubStandin]:
    """A started stand-in serving the repos both download test files use."""
    hub = HubStandin(tokens={GOOD_TOKEN, NO_ACCESS_TOKEN})
    hub.add(synthetic_repo("acme/tiny"))
    hub.add(synthetic_repo("acme/gated", gated=True, allowed_tokens={GOOD_TOKEN}))
    hub.add(synthetic_repo("acme/private", private=True, allowed_tokens={GOOD_TOKEN}))
    hub.add(synthetic_repo("acme/huge", weights_size=1024, listed_sizes={"model.safetensors": 2**50}))
    hub.add(synthetic_repo("acme/slow", weights_size=2 * 1024 * 1024))
    hub.add(
        StandinRepo("acme/tiny-gguf", {"README.md": b"#", "tiny.Q4_0.gguf": b"not a GGUF file", "x.Q8_0.gguf": b"G"})
    )
    with hub:
        yield hub


def run_download(
    hf_home: Path,
    endpoint: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem_launcher", "download", *args],
        env=child_env(hf_home, endpoint, env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def child_env(hf_home: Path, endpoint: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in HUB_VARIABLES}
    return {**environ, "HF_HOME": str(hf_home), "HF_ENDPOINT": endpoint, **(extra or {})}


def point_launcher_at(monkeypatch: pytest.MonkeyPatch, hf_home: Path, endpoint: str) -> None:
    """The launcher started in-process reads the Hub at `endpoint` with `hf_home` as its cache, and no other
    Hub variable of this environment."""
    for name in HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_ENDPOINT", endpoint)


def snapshot_of(hf_home: Path, repo_id: str) -> Path:
    storage = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = (storage / "refs" / "main").read_text().strip()
    return storage / "snapshots" / commit


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]
