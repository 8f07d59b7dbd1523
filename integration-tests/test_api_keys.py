"""API keys through the real launcher: missing, wrong and case-altered keys get 401 on every protected route, either
key works, probes and metrics stay open, no key appears on a child's argv, and SIGHUP reloads the key file."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from tandem_harness import TandemServer, model_cache_dir

INLINE_KEY = "sk-tandem-Inline-7f3a"
# In the launcher's environment but overridden by its --api-key flag: must stay refused.
OVERRIDDEN_ENV_KEY = "sk-tandem-env-overridden-04be"
FILE_KEY = "sk-tandem-file-91c2"
ROTATED_KEY = "sk-tandem-rotated-55d0"
CHAT = {"model": "tandem", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
PROTECTED = (
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "tandem", "prompt": "Hi", "max_tokens": 2}),
    ("POST", "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
    ("POST", "/generate_stream", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
    ("GET", "/v1/models", None),
    ("GET", "/info", None),
)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# test keys\n{FILE_KEY}\n")
    return path


@pytest.fixture(scope="module")
def keyed_tandem(tmp_path_factory: pytest.TempPathFactory, key_file: Path) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("api-keys") / "launcher.log"
    flags = (
        "--model-cache-dir", str(model_cache_dir()), "--kv-cache-memory", "64MiB",
        "--max-input-tokens", "256", "--max-total-tokens", "512",
        "--api-key", INLINE_KEY, "--api-key-file", str(key_file),
    )  # fmt: skip
    previous = os.environ.get("API_KEY")
    os.environ["API_KEY"] = OVERRIDDEN_ENV_KEY
    try:
        server = TandemServer.start(log_path, *flags)
    finally:
        if previous is None:
            del os.environ["API_KEY"]
        else:
            os.environ["API_KEY"] = previous
    yield server
    assert server.stop() == 0, server.log_tail()


def call(server: TandemServer, method: str, path: str, body: dict | None, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.request(method, f"{server.base_url}{path}", json=body, headers=headers, timeout=120)


@pytest.mark.parametrize(
    "key", [None, "sk-wrong", INLINE_KEY.lower(), INLINE_KEY.upper(), INLINE_KEY[:-1], OVERRIDDEN_ENV_KEY], ids=str
)
def test_requests_without_an_accepted_key_get_401_in_the_route_shape(keyed_tandem: TandemServer, key) -> None:
    for method, path, body in PROTECTED:
        response = call(keyed_tandem, method, path, body, key)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        if path.startswith("/v1/"):
            assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        else:
            assert response.json()["error_type"] == "unauthorized"
        assert "sk-" not in response.text, "the error never echoes a key"


@pytest.mark.parametrize("key", [INLINE_KEY, FILE_KEY])
def test_either_key_opens_every_protected_route(keyed_tandem: TandemServer, key: str) -> None:
    for method, path, body in PROTECTED:
        response = call(keyed_tandem, method, path, body, key)
        assert response.status_code == 200, (path, response.text)


def test_probes_and_metrics_stay_open(keyed_tandem: TandemServer) -> None:
    for path in ("/health", "/ready", "/metrics"):
        assert requests.get(f"{keyed_tandem.base_url}{path}", timeout=30).status_code == 200, path


def test_no_key_appears_on_any_childs_command_line_or_in_the_logs(keyed_tandem: TandemServer) -> None:
    call(keyed_tandem, "POST", "/v1/chat/completions", CHAT, "sk-wrong-key-in-log")
    for child in psutil.Process(keyed_tandem.process.pid).children(recursive=True):
        command = " ".join(child.cmdline())
        assert INLINE_KEY not in command and FILE_KEY not in command, command
        assert OVERRIDDEN_ENV_KEY not in child.environ().values(), command
    log = keyed_tandem.log_path.read_text(errors="replace")
    assert INLINE_KEY not in log and FILE_KEY not in log and "sk-wrong-key-in-log" not in log


def test_sighup_reloads_the_key_file(keyed_tandem: TandemServer, key_file: Path) -> None:
    key_file.write_text(f"{ROTATED_KEY}\n")
    keyed_tandem.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while call(keyed_tandem, "GET", "/v1/models", None, ROTATED_KEY).status_code != 200:
        assert time.monotonic() < deadline, keyed_tandem.log_tail()
        time.sleep(0.2)
    assert call(keyed_tandem, "GET", "/v1/models", None, FILE_KEY).status_code == 401
    assert call(keyed_tandem, "GET", "/v1/models", None, INLINE_KEY).status_code == 200
    key_file.write_text(f"{FILE_KEY}\n")
    keyed_tandem.process.send_signal(signal.SIGHUP)
