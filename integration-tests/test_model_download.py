"""`tandem-launcher --model-id org/model` on a model not in the cache: the real launcher downloads it from a Hub
stand-in (HF_ENDPOINT) and serves a chat; started again with the stand-in stopped, it serves from the cache."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from tandem_harness import TandemServer, embedded_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher" / "tests"))

from hub_standin import HubStandin
from hub_standin_repos import StandinRepo, write_tiny_llama_repo

REPO_ID = "tandem-tests/tiny-llama-chat"
SERVED = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]
_HUB_VARIABLES = ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH", "MODEL_ID")


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    """A tiny random-weight Llama with the embedded SmolLM2's tokenizer and chat template."""
    tokenizer_dir = embedded_model_dir()
    repo_dir = write_tiny_llama_repo(tmp_path_factory.mktemp("repo"), tokenizer_dir)
    hub = HubStandin()
    hub.add(StandinRepo.from_directory(REPO_ID, repo_dir))
    with hub:
        yield hub


def chat(server: TandemServer) -> str:
    body = {"model": REPO_ID, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}
    response = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == REPO_ID
    return answer["choices"][0]["message"]["content"]


def test_the_launcher_downloads_a_repo_serves_it_and_later_starts_from_the_cache_without_the_hub(
    standin: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    flags = ("--model-id", REPO_ID, "--model-cache-dir", str(tmp_path / "models"), "--kv-cache-memory", "64MiB")

    first = TandemServer.start(tmp_path / "first.log", *flags)
    try:
        assert chat(first)
    finally:
        assert first.stop() == 0, first.log_tail()
    log = (tmp_path / "first.log").read_text()
    served = [name for name in SERVED if name in standin.repos[REPO_ID].files]  # a chat_template.jinja only if written
    assert f"fetching {len(served)} of {len(served)} files" in log and f"of {REPO_ID} at commit" in log
    assert "downloaded " in log and f"{REPO_ID} is ready to serve from " in log
    snapshot = next((tmp_path / "hf" / "hub").glob("models--*/snapshots/*"))
    assert sorted(path.name for path in snapshot.iterdir()) == served

    standin.stop()
    second = TandemServer.start(tmp_path / "second.log", *flags)
    try:
        assert chat(second)
    finally:
        assert second.stop() == 0, second.log_tail()
    log = (tmp_path / "second.log").read_text()
    assert "fetching" not in log and f"model directory: {snapshot}" in log
