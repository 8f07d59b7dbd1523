"""OpenAI chat streaming over raw SSE."""

from __future__ import annotations

import json

import conformance
import requests
from tandem_harness import TandemServer


def test_streamed_chat_names_paris_and_ends_with_done(tandem: TandemServer) -> None:
    body = {
        "model": "tandem",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
    }
    with requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        data_lines = [line[len("data:") :].strip() for line in response.iter_lines(decode_unicode=True) if line]
    assert data_lines[-1] == "[DONE]"
    chunks = [json.loads(data) for data in data_lines[:-1]]
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert "Paris" in content
    finish_reasons = [chunk["choices"][0].get("finish_reason") for chunk in chunks if chunk["choices"]]
    assert finish_reasons[-1] in ("stop", "length")
