"""Server flags of the client-facing API, through the launcher: a chat template file, usage in every stream,
the payload limit, and a model without a chat template (it chats in its family's format)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import conformance
import pytest
import requests
from tandem_harness import TandemServer, embedded_model_dir, model_cache_dir

# Renders only the last message's text, so the prompt is exactly that text.
ECHO_TEMPLATE = "{{ messages[-1]['content'] }}"
PAYLOAD_LIMIT = 4096


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    directory = tmp_path_factory.mktemp("api-flags")
    template = directory / "chat.jinja"
    template.write_text(ECHO_TEMPLATE)
    server = TandemServer.start(
        directory / "launcher.log",
        "--model-cache-dir", str(model_cache_dir()),
        "--kv-cache-memory", "64MiB",
        "--chat-template", str(template),
        "--always-include-usage",
        "--payload-limit", str(PAYLOAD_LIMIT),
        "--max-client-batch-size", "2",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def test_the_chat_template_file_replaces_the_models(flagged: TandemServer) -> None:
    text = "Once upon a time"
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
    completion = requests.post(f"{flagged.base_url}/v1/chat/completions", json=body, timeout=120).json()
    conformance.openai("CreateChatCompletionResponse", completion)
    tokens = requests.post(f"{flagged.base_url}/tokenize", json={"inputs": text}, timeout=30).json()
    assert completion["usage"]["prompt_tokens"] == len(tokens)


def test_every_stream_ends_with_usage_and_limits_apply(flagged: TandemServer) -> None:
    body = {"prompt": "Hello", "max_tokens": 3, "stream": True}
    with requests.post(f"{flagged.base_url}/v1/completions", json=body, stream=True, timeout=120) as reply:
        events = conformance.sse_events(reply.iter_lines(decode_unicode=True))
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    too_big = requests.post(f"{flagged.base_url}/generate", json={"inputs": "x" * PAYLOAD_LIMIT}, timeout=30)
    assert too_big.status_code == 413 and too_big.json()["error_type"] == "validation"
    three = requests.post(f"{flagged.base_url}/v1/completions", json={"prompt": ["a", "b", "c"]}, timeout=30)
    assert three.status_code == 400 and three.json()["error"]["param"] == "prompt"
    info = flagged.info()
    assert (info["payload_limit"], info["always_include_usage"], info["max_client_batch_size"]) == (4096, True, 2)


def _model_without_template(directory: Path) -> Path:
    source = embedded_model_dir()
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        (directory / name).symlink_to(source / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_a_model_without_a_chat_template_chats_in_its_familys_format(tandem: TandemServer, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    server = TandemServer.start(
        tmp_path / "launcher.log", "--model-id", str(_model_without_template(model)), "--kv-cache-memory", "64MiB",
    )  # fmt: skip
    try:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
        completion = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120).json()
        conformance.openai("CreateChatCompletionResponse", completion)
        chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        tokens = requests.post(f"{server.base_url}/tokenize", json={"inputs": chatml}, timeout=30).json()
        assert completion["usage"]["prompt_tokens"] == len(tokens)
        assert "no chat template" in server.log_path.read_text(errors="replace")
    finally:
        assert server.stop() == 0, server.log_tail()
