"""A reasoning model through the real stack: a random-weight Llama whose tokenizer knows `<think>` and `</think>` and
whose chat template opens the reasoning itself (as DeepSeek-R1's does), so `--reasoning-parser auto` finds it. Its
reasoning comes apart from its answer on every chat surface, whole and streamed, read by the OpenAI and Anthropic
SDKs; a reasoning budget is a grammar, so past it the end marker comes and the answer follows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import conformance
import openai
import pytest
import requests
import torch
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from tandem_harness import FLOAT32_EAGER, TandemServer, added_token, embedded_model_dir, sse_lines, tiny_llama_config
from transformers import LlamaForCausalLM

END = "</think>"
# Opens the reasoning in the generation prompt and drops earlier answers' reasoning, as DeepSeek-R1's template does.
R1_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content.split('</think>')[-1] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
ASK = [{"role": "user", "content": "Is 7 prime?"}]
SEEDED = {"temperature": 1.0, "seed": 3}
ANTHROPIC_EVENT = TypeAdapter(RawMessageStreamEvent)
RESPONSES_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def reasoning_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tokenizer with `<think>` and `</think>` added after its vocabulary, an R1-style template, and a
    small random Llama over that vocabulary."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp("reasoning-model")
    tokenizer = json.loads((embedded / "tokenizer.json").read_text())
    vocab_size = len(tokenizer["model"]["vocab"])
    tokenizer["added_tokens"] += [
        added_token(vocab_size, "<think>", special=False),
        added_token(vocab_size + 1, END, special=False),
    ]
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    tokenizer_config = json.loads((embedded / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (model_dir / "chat_template.jinja").write_text(R1_TEMPLATE)
    torch.manual_seed(0)
    config = tiny_llama_config(vocab_size + 2, max_position_embeddings=2048, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    return model_dir


@pytest.fixture(scope="module")
def thinker(reasoning_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("thinker") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-id", str(reasoning_model_dir), *FLOAT32_EAGER,
        "--kv-cache-memory", "32MiB",
        "--max-input-tokens", "256",
        "--max-total-tokens", "2048",
        "--speculate", "3",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def _openai(server: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _anthropic(server: TandemServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def test_past_the_budget_the_end_marker_comes_and_the_answer_follows(thinker: TandemServer) -> None:
    """`reasoning_effort: minimal` is a budget of 256 tokens; a random model never ends its reasoning by itself, so
    the grammar ends it: at most 256 tokens come before the end marker, then the answer."""
    body = {"messages": ASK, "reasoning_effort": "minimal", "max_tokens": 300, "logprobs": True, **SEEDED}
    reply = requests.post(f"{thinker.base_url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    conformance.openai("CreateChatCompletionResponse", reply.json())
    choice = reply.json()["choices"][0]
    # Per-token texts (a character split over tokens shows as U+FFFD in each), joined: the marker is ASCII.
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    generated = "".join(tokens)
    assert END in generated, generated
    before_end = generated.index(END)
    reasoning_tokens = 0
    while len("".join(tokens[: reasoning_tokens + 1])) <= before_end:
        reasoning_tokens += 1
    assert 0 < reasoning_tokens <= 256
    assert len(tokens) > reasoning_tokens + 1, "the answer follows the marker"
    message = choice["message"]
    assert message["reasoning_content"] and END not in message["reasoning_content"]
    assert message["content"] and END not in message["content"]


def test_chat_reasoning_reaches_the_openai_sdk_whole_and_streamed(thinker: TandemServer) -> None:
    client = _openai(thinker)
    completion = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, **SEEDED)
    reasoning = completion.choices[0].message.reasoning_content
    assert reasoning and END not in reasoning
    stream = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, stream=True, **SEEDED)
    streamed = ""
    for chunk in stream:
        if chunk.choices:
            streamed += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    assert streamed == reasoning


def test_raw_chat_stream_chunks_follow_the_schema(thinker: TandemServer) -> None:
    body = {"messages": ASK, "max_tokens": 40, "stream": True, "reasoning_effort": "minimal", **SEEDED}
    with requests.post(f"{thinker.base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
        events = conformance.sse_events(sse_lines(reply))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert any(delta.get("reasoning_content") for delta in deltas)
    assert all(END not in (delta.get("content") or "") + (delta.get("reasoning_content") or "") for delta in deltas)


def test_thinking_with_a_budget_reaches_the_anthropic_sdk_whole_and_streamed(thinker: TandemServer) -> None:
    client = _anthropic(thinker)
    fields: dict[str, Any] = {
        "model": "m", "messages": ASK, "max_tokens": 1040, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_body": {"temperature": 1.0},
    }  # fmt: skip
    message = Message.model_validate(client.messages.create(**fields).model_dump())
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    with client.messages.stream(**fields) as stream:
        events = [ANTHROPIC_EVENT.validate_python(event.model_dump()) for event in stream if event.type in _RAW]
        final = stream.get_final_message()
    deltas = [event.delta.type for event in events if event.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and "text_delta" in deltas
    assert final.content[0].type == "thinking" and final.content[0].thinking
    assert END not in final.content[0].thinking


_RAW = {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"}  # fmt: skip


def test_responses_carry_reasoning_items_and_reasoning_tokens_whole_and_streamed(thinker: TandemServer) -> None:
    client = _openai(thinker)
    fields: dict[str, Any] = {
        "model": "m",
        "input": "Is 7 prime?",
        "max_output_tokens": 30,
        "reasoning": {"effort": "minimal"},
    }
    response = Response.model_validate(client.responses.create(**fields).model_dump())
    item = response.output[0]
    assert item.type == "reasoning" and item.content and item.content[0].text
    assert response.usage is not None and 0 < response.usage.output_tokens_details.reasoning_tokens <= 30
    events = [
        RESPONSES_EVENT.validate_python(event.model_dump()) for event in client.responses.create(stream=True, **fields)
    ]
    kinds = [event.type for event in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")


def test_bad_reasoning_settings_are_refused_naming_them(thinker: TandemServer) -> None:
    with pytest.raises(openai.BadRequestError) as effort:
        _openai(thinker).chat.completions.create(model="m", messages=ASK, reasoning_effort="max")
    assert "reasoning_effort" in str(effort.value)
    with pytest.raises(anthropic.BadRequestError) as budget:
        _anthropic(thinker).messages.create(
            model="m", messages=ASK, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 0}
        )
    assert "thinking.budget_tokens" in str(budget.value)
