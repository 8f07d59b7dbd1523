"""Every OpenAI response shape validates against OpenAI's published schemas: chat, completions (every prompt
form, echo), streams with usage, n=3, models and errors."""

from __future__ import annotations

import json
from typing import Any

import conformance
import requests
from tandem_harness import TandemServer, sse_lines

QUESTION = [{"role": "user", "content": "Name a colour."}]


def _post(tandem: TandemServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(f"{tandem.base_url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def _stream(tandem: TandemServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with requests.post(f"{tandem.base_url}{path}", json={**body, "stream": True}, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        events = conformance.sse_events(sse_lines(reply))
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def counts(usage: dict[str, Any]) -> dict[str, Any]:
    """`usage` without the cached prompt tokens, which a repeated request may have more of."""
    return {key: value for key, value in usage.items() if key != "prompt_tokens_details"}


def test_chat_with_n_3_and_its_stream_with_usage_validate(tandem: TandemServer) -> None:
    body = {"messages": QUESTION, "max_tokens": 6, "n": 3, "seed": 5, "temperature": 0.8}
    completion = _post(tandem, "/v1/chat/completions", body)
    conformance.openai("CreateChatCompletionResponse", completion)
    assert [choice["index"] for choice in completion["choices"]] == [0, 1, 2]
    chunks = _stream(tandem, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)
    assert chunks[-1]["choices"] == [] and counts(chunks[-1]["usage"]) == counts(completion["usage"])


def test_completions_of_every_prompt_form_validate(tandem: TandemServer) -> None:
    tokens = [token["id"] for token in _post(tandem, "/tokenize", {"inputs": "The sky is"})]
    for prompt in ("The sky is", ["The sky is", "Grass is"], tokens, [tokens, tokens[:2]]):
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "n": 2}
        completion = _post(tandem, "/v1/completions", body)
        conformance.openai("CreateCompletionResponse", completion)
        prompts = len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
        assert [choice["index"] for choice in completion["choices"]] == list(range(2 * prompts))
    by_text = _post(tandem, "/v1/completions", {"prompt": "The sky is", "max_tokens": 4, "temperature": 0})
    by_ids = _post(tandem, "/v1/completions", {"prompt": tokens, "max_tokens": 4, "temperature": 0})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(tokens)


def test_echo_prepends_the_prompt_streamed_or_not(tandem: TandemServer) -> None:
    body = {"prompt": "The sky is", "max_tokens": 4, "temperature": 0, "echo": True}
    completion = _post(tandem, "/v1/completions", body)
    conformance.openai("CreateCompletionResponse", completion)
    text = completion["choices"][0]["text"]
    assert text.startswith("The sky is") and len(text) > len("The sky is")
    chunks = _stream(tandem, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks:
        conformance.openai_completion_chunk(chunk)
    assert "".join(choice["text"] for chunk in chunks for choice in chunk["choices"]) == text
    assert counts(chunks[-1]["usage"]) == counts(completion["usage"])


def test_models_list_validates(tandem: TandemServer) -> None:
    models = requests.get(f"{tandem.base_url}/v1/models", timeout=30).json()
    conformance.openai("ListModelsResponse", models)


def test_errors_validate_and_name_their_parameter(tandem: TandemServer) -> None:
    cases = [
        ({"prompt": [[1], [999_999_999]], "max_tokens": 2}, "prompt"),
        ({"prompt": ["a"] * 5, "max_tokens": 2}, "prompt"),
        ({"prompt": "a", "suffix": "b"}, "suffix"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "echo": True, "max_tokens": 0, "min_tokens": 1}, "min_tokens"),
        ({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}, "stop"),
    ]
    for body, param in cases:
        response = requests.post(f"{tandem.base_url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 400, response.text
        conformance.openai("ErrorResponse", response.json())
        assert response.json()["error"]["param"] == param
    chat = {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}
    response = requests.post(f"{tandem.base_url}/v1/chat/completions", json=chat, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "continue_final_message"


def test_a_body_over_the_payload_limit_is_413_in_each_routes_shape(tandem: TandemServer) -> None:
    limit = tandem.info()["payload_limit"]
    padding = "x" * limit
    response = requests.post(f"{tandem.base_url}/v1/completions", json={"prompt": padding}, timeout=30)
    assert response.status_code == 413
    conformance.openai("ErrorResponse", response.json())
    response = requests.post(f"{tandem.base_url}/generate", json={"inputs": padding}, timeout=30)
    assert response.status_code == 413
    conformance.tgi("ErrorResponse", response.json())


def test_a_continued_assistant_message_is_extended_not_restarted(tandem: TandemServer) -> None:
    messages = [*QUESTION, {"role": "assistant", "content": "My favourite colour is"}]
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "continue_final_message": True}
    continued = _post(tandem, "/v1/chat/completions", body)
    conformance.openai("CreateChatCompletionResponse", continued)
    restarted = _post(tandem, "/v1/chat/completions", {**body, "continue_final_message": False})
    # The continuation sees the open message (no end-of-turn, no new assistant header): fewer prompt tokens.
    assert continued["usage"]["prompt_tokens"] < restarted["usage"]["prompt_tokens"]
    assert not continued["choices"][0]["message"]["content"].startswith("My favourite")
