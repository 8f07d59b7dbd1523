"""Logprobs, penalties and prompt logprobs through the real stack, in OpenAI's and TGI's documented shapes."""

from __future__ import annotations

import json
from typing import Any

import conformance
import pytest
import requests
from tandem_harness import TandemServer, sse_lines

QUESTION = [{"role": "user", "content": "List three colours."}]


def _post(tandem: TandemServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(f"{tandem.base_url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_chat_logprobs_are_sane_and_greedy_picks_the_top_alternative(tandem: TandemServer) -> None:
    body = {"messages": QUESTION, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    completion = _post(tandem, "/v1/chat/completions", body)
    conformance.openai("CreateChatCompletionResponse", completion)
    content = completion["choices"][0]["logprobs"]["content"]
    assert len(content) == completion["usage"]["completion_tokens"]
    for entry in content:
        top = entry["top_logprobs"]
        assert entry["logprob"] <= 0.0
        assert len(top) == 5
        assert [alt["logprob"] for alt in top] == sorted((alt["logprob"] for alt in top), reverse=True)
        assert top[0]["token"] == entry["token"]
        assert entry["logprob"] == pytest.approx(top[0]["logprob"], abs=1e-6)
        assert bytes(entry["bytes"]).decode("utf-8", errors="replace") == entry["token"]


def test_completion_logprobs_and_stream_chunks_validate(tandem: TandemServer) -> None:
    body = {"prompt": "The sky is", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    completion = _post(tandem, "/v1/completions", body)
    conformance.openai("CreateCompletionResponse", completion)
    logprobs = completion["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 6
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])
    stream_body = {"messages": QUESTION, "max_tokens": 6, "temperature": 0, "logprobs": True, "stream": True}
    with requests.post(f"{tandem.base_url}/v1/chat/completions", json=stream_body, stream=True, timeout=300) as reply:
        chunks = [json.loads(line[6:]) for line in sse_lines(reply) if line[6:] not in ("", "[DONE]")]
    streamed = [entry for chunk in chunks[1:] for entry in chunk["choices"][0]["logprobs"]["content"]]
    assert len(streamed) == 6
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)


def test_penalties_change_greedy_output(tandem: TandemServer) -> None:
    body = {"prompt": "one one one one one", "max_tokens": 16, "temperature": 0}
    plain = _post(tandem, "/v1/completions", body)["choices"][0]["text"]
    penalized = _post(tandem, "/v1/completions", {**body, "frequency_penalty": 2.0, "presence_penalty": 2.0})
    assert penalized["choices"][0]["text"] != plain
    repeated = _post(tandem, "/v1/completions", {**body, "repetition_penalty": 2.0})
    assert repeated["choices"][0]["text"] != plain


def test_tgi_prefill_details_and_top_tokens(tandem: TandemServer) -> None:
    parameters = {"max_new_tokens": 4, "details": True, "decoder_input_details": True, "top_n_tokens": 2}
    response = _post(tandem, "/generate", {"inputs": "The capital of France is", "parameters": parameters})
    conformance.tgi("GenerateResponse", response)
    details = response["details"]
    assert details["prefill"][0]["logprob"] is None
    assert all(token["logprob"] <= 0.0 for token in details["prefill"][1:])
    assert len(details["top_tokens"]) == len(details["tokens"]) == 4
    for token, top in zip(details["tokens"], details["top_tokens"], strict=True):
        assert top[0]["id"] == token["id"]
