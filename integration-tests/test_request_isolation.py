"""A request whose own constraints cannot be met fails alone, through the real stack: its client gets a short error
in its route's shape, a concurrent greedy stream produces exactly its alone-output, and the shards never restart."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import requests
from tandem_harness import TandemServer, sse_lines

STREAM_PROMPT = "Write a short story about a lighthouse keeper and a storm."
STREAM_TOKENS = 48
DIGIT_MIN_TOKENS = 10


def digit_token_ids(tandem: TandemServer) -> list[int]:
    ids = []
    for digit in "0123456789":
        response = requests.post(f"{tandem.base_url}/tokenize", json={"inputs": digit}, timeout=30)
        assert response.status_code == 200, response.text
        tokens = response.json()
        assert len(tokens) == 1, tokens
        ids.append(tokens[0]["id"])
    return ids


def impossible_chat(tandem: TandemServer, regex: str, stream: bool) -> dict[str, Any]:
    """A chat whose grammar, at some point, allows only digits while every digit is a stop token it must not
    sample yet (min_tokens): no token is left for it."""
    return {
        "model": "tandem",
        "messages": [{"role": "user", "content": "Give me a code."}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": stream,
        "response_format": {"type": "regex", "value": regex},
        "min_tokens": DIGIT_MIN_TOKENS,
        "stop_token_ids": digit_token_ids(tandem),
    }


def beside_a_greedy_stream(tandem: TandemServer, hostile: Callable[[], Any]) -> tuple[list[int], Any]:
    """Runs `hostile` once the concurrent greedy stream has produced its first token; both results."""
    first_token = threading.Event()
    streamed: list[int] = []

    def stream() -> None:
        body = {"inputs": STREAM_PROMPT, "parameters": {"max_new_tokens": STREAM_TOKENS}}
        with requests.post(f"{tandem.base_url}/generate_stream", json=body, stream=True, timeout=300) as response:
            assert response.status_code == 200, response.text
            for line in sse_lines(response):
                if line and line.startswith("data:"):
                    streamed.append(json.loads(line[len("data:") :])["token"]["id"])
                    first_token.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first_token.wait(timeout=120)
    result = hostile()
    thread.join(timeout=300)
    return streamed, result


@pytest.fixture(scope="module")
def alone_output(tandem: TandemServer) -> list[int]:
    return tandem.stream_ids(STREAM_PROMPT, STREAM_TOKENS)


def test_a_request_with_no_valid_token_fails_alone_with_a_4xx(tandem: TandemServer, alone_output: list[int]) -> None:
    failures_before = tandem.metric("tandem_request_step_failures_total")
    body = impossible_chat(tandem, "[0-9]{4}", stream=False)

    streamed, response = beside_a_greedy_stream(
        tandem, lambda: requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, timeout=120)
    )
    assert streamed == alone_output
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "no token" in message and len(message) < 200, message
    assert tandem.metric("tandem_request_step_failures_total") == failures_before + 1
    health = requests.get(f"{tandem.base_url}/health", timeout=10)
    assert health.status_code == 200, health.text
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=10) == 0


def test_a_streamed_request_failing_deep_into_its_generation_ends_with_an_error_event(
    tandem: TandemServer, alone_output: list[int]
) -> None:
    # "code-" comes first (several tokens), then only digits would do.
    body = impossible_chat(tandem, "code-[0-9]{4}", stream=True)

    def hostile_stream() -> list[str]:
        with requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, stream=True, timeout=120) as response:
            assert response.status_code == 200, response.text
            return [line[len("data: ") :] for line in sse_lines(response) if line]

    streamed, events = beside_a_greedy_stream(tandem, hostile_stream)
    assert streamed == alone_output
    assert events[-1] == "[DONE]", events
    error = json.loads(events[-2])["error"]
    assert error["type"] == "invalid_request_error" and "no token" in error["message"], error
    content = "".join(
        (json.loads(event)["choices"][0]["delta"].get("content") or "") for event in events[:-2] if "choices" in event
    )
    assert content == "code-", events
    assert requests.get(f"{tandem.base_url}/health", timeout=10).status_code == 200
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=10) == 0
