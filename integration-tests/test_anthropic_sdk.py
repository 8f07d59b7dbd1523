"""The Anthropic Messages API through the real stack with the official `anthropic` SDK, every answer
validated against the SDK's own types."""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter
from tandem_harness import TandemServer

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA}]
STREAM_EVENT = TypeAdapter(RawMessageStreamEvent)
# This SDK's `create` has no sampling arguments; the fields still reach the server in the body.
GREEDY = {"extra_body": {"temperature": 0, "top_k": 1}}


def _client(tandem: TandemServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=tandem.base_url, api_key="unused", timeout=300, max_retries=0)


def _create(tandem: TandemServer, **fields: Any) -> Message:
    """Creates a message and validates the raw JSON answer against the SDK's `Message`."""
    fields = {"model": "tandem", "messages": ASK, "max_tokens": 12, **GREEDY, **fields}
    raw = _client(tandem).messages.with_raw_response.create(**fields)
    return Message.model_validate(raw.http_response.json(), strict=False)


def _tool_uses(message: Message) -> list[Any]:
    return [block for block in message.content if block.type == "tool_use"]


def test_create_answers_a_valid_message_whose_usage_matches_count_tokens(tandem: TandemServer) -> None:
    message = _create(tandem, system="Answer briefly.")
    assert message.role == "assistant" and message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content and message.content[0].type == "text" and message.content[0].text
    assert 0 < message.usage.output_tokens <= 12
    counted = _client(tandem).messages.count_tokens(model="tandem", system="Answer briefly.", messages=ASK)
    assert isinstance(MessageTokensCount.model_validate(counted.model_dump()), MessageTokensCount)
    # The prompt is what was computed plus what the prefix cache served.
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_a_stop_sequence_ends_the_message_and_is_named(tandem: TandemServer) -> None:
    message = _create(tandem, max_tokens=32, stop_sequences=[" "])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == " "
    assert all(" " not in block.text for block in message.content if block.type == "text")


def test_stream_events_are_valid_and_rebuild_the_message(tandem: TandemServer) -> None:
    client = _client(tandem)
    raw_events = client.messages.create(model="tandem", messages=ASK, max_tokens=12, stream=True, **GREEDY)
    events = [STREAM_EVENT.validate_python(event.model_dump()) for event in raw_events]
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    with client.messages.stream(model="tandem", messages=ASK, max_tokens=12, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = Message.model_validate(stream.get_final_message().model_dump())
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


def test_any_tool_choice_calls_a_tool_and_its_result_continues_the_conversation(tandem: TandemServer) -> None:
    called = _create(tandem, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=60)
    assert called.stop_reason == "tool_use"
    (call,) = _tool_uses(called)
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    turns = [
        *ASK,
        {"role": "assistant", "content": called.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]},
    ]
    answer = _create(tandem, messages=turns, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=16)
    assert not _tool_uses(answer) and answer.content[0].type == "text"


def test_a_streamed_named_tool_call_arrives_as_input_json_deltas(tandem: TandemServer) -> None:
    client = _client(tandem)
    fields: dict[str, Any] = {"model": "tandem", "messages": ASK, "max_tokens": 60, **GREEDY,
                              "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}}  # fmt: skip
    with client.messages.stream(**fields) as stream:
        events = [STREAM_EVENT.validate_python(event.model_dump()) for event in stream if event.type != "input_json"]
        final = Message.model_validate(stream.get_final_message().model_dump())
    deltas = [event.delta.type for event in events if event.type == "content_block_delta"]
    assert deltas and set(deltas) == {"input_json_delta"}
    assert final.stop_reason == "tool_use"
    (call,) = _tool_uses(final)
    jsonschema.validate(call.input, WEATHER_SCHEMA)


def test_refusals_reach_the_sdk_as_its_typed_errors(tandem: TandemServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(tandem).messages.create(model="tandem", messages=ASK, max_tokens=0)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in refused.value.body["error"]["message"]
