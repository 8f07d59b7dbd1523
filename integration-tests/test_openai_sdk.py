"""The official `openai` client works against Tandem unchanged."""

from __future__ import annotations

import openai
import pytest
from tandem_harness import TandemServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(tandem: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tandem.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="tandem", messages=QUESTION, max_tokens=24, temperature=0)
    choice = completion.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens > 0 and 0 < completion.usage.completion_tokens <= 24


def test_chat_completion_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tandem", messages=QUESTION, max_tokens=24, temperature=0, stream=True
    )
    content = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "Paris" in content


def test_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="tandem", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text.strip()
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens <= 8


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
