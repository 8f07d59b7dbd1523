"""`huggingface_hub.InferenceClient` works against Tandem unchanged: text generation and chat, streamed or not."""

from __future__ import annotations

import pytest
from huggingface_hub import InferenceClient
from tandem_harness import TandemServer

PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(tandem: TandemServer) -> InferenceClient:
    return InferenceClient(base_url=tandem.base_url, timeout=120)


def test_text_generation_with_details(client: InferenceClient) -> None:
    output = client.text_generation(PROMPT, max_new_tokens=6, details=True, decoder_input_details=True, seed=1)
    assert output.generated_text and output.details is not None
    assert output.details.finish_reason in ("length", "eos_token", "stop_sequence")
    assert len(output.details.tokens) == output.details.generated_tokens <= 6
    assert "".join(token.text for token in output.details.tokens) == output.generated_text
    assert output.details.prefill[0].logprob is None


def test_text_generation_stream_with_details(client: InferenceClient) -> None:
    plain = client.text_generation(PROMPT, max_new_tokens=6)
    events = list(client.text_generation(PROMPT, max_new_tokens=6, stream=True, details=True))
    assert all(event.token.id >= 0 for event in events)
    assert events[-1].details is not None and events[-1].generated_text == plain
    assert "".join(event.token.text for event in events) == plain


def test_chat_completion(client: InferenceClient) -> None:
    output = client.chat_completion(QUESTION, max_tokens=24, temperature=0)
    assert "Paris" in output.choices[0].message.content
    assert output.usage.completion_tokens <= 24


def test_chat_completion_stream(client: InferenceClient) -> None:
    chunks = list(client.chat_completion(QUESTION, max_tokens=24, temperature=0, stream=True))
    assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
