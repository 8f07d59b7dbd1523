"""The OpenAI Responses API through the real stack with the official `openai` SDK, every answer validated
against the SDK's own types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
import requests
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from tandem_harness import TandemServer, model_cache_dir

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
GREEDY: dict[str, Any] = {"temperature": 0}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": CITY_SCHEMA}
]
ASK = "What is the weather in Paris?"
INSTRUCTIONS = "You are a friendly assistant."


def _client(server: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=300, max_retries=0)


def _create(server: TandemServer, **fields: Any) -> Response:
    """Creates a response and validates the raw JSON answer against the SDK's `Response`."""
    fields = {"model": "tandem", "input": ASK, "max_output_tokens": 12, **GREEDY, **fields}
    raw = _client(server).responses.with_raw_response.create(**fields)
    return Response.model_validate(raw.http_response.json(), strict=False)


def _calls(response: Response) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def test_create_answers_a_valid_response_with_text_and_usage(tandem: TandemServer) -> None:
    response = _create(tandem, instructions="Answer briefly.")
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    assert response.usage is not None and 0 < response.usage.output_tokens <= 12
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    short = _create(tandem, max_output_tokens=1)
    assert short.status == "incomplete"
    assert short.incomplete_details is not None and short.incomplete_details.reason == "max_output_tokens"


def test_stream_events_are_valid_ordered_and_rebuild_the_response(tandem: TandemServer) -> None:
    client = _client(tandem)
    stream = client.responses.create(model="tandem", input=ASK, max_output_tokens=12, stream=True, **GREEDY)
    events = [STREAM_EVENT.validate_python(event.model_dump()) for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text and final.output_text == text
    with client.responses.stream(model="tandem", input=ASK, max_output_tokens=12, **GREEDY) as helper:
        helper_events = list(helper)
        helper_text = "".join(event.delta for event in helper_events if event.type == "response.output_text.delta")
        if helper_events[-1].type == "response.completed":
            assert Response.model_validate(helper.get_final_response().model_dump()).output_text == helper_text
    assert helper_text == text, "greedy streams of one prompt differ"


def test_a_json_schema_format_constrains_the_output(tandem: TandemServer) -> None:
    text_format = {"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA, "strict": True}}
    response = _create(tandem, input="Name a city in France, as JSON.", text=text_format, max_output_tokens=40)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CITY_SCHEMA)
    loose = _create(tandem, input="A JSON object about Paris.", text={"format": {"type": "json_object"}},
                    max_output_tokens=60)  # fmt: skip
    if loose.status == "completed":
        assert isinstance(json.loads(loose.output_text), dict)


def test_a_required_tool_call_and_its_output_continue_the_conversation(tandem: TandemServer) -> None:
    called = _create(tandem, tools=TOOLS, tool_choice="required", max_output_tokens=60)
    (call,) = _calls(called)
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), CITY_SCHEMA)
    turns: list[Any] = [
        {"role": "user", "content": ASK},
        *[item.model_dump(exclude_none=True) for item in called.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
    ]
    answer = _create(tandem, input=turns, tools=TOOLS, tool_choice="none", max_output_tokens=16, store=False)
    assert not _calls(answer) and answer.output_text
    follow_up = [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}]
    chained = _create(tandem, input=follow_up, previous_response_id=called.id, tools=TOOLS, tool_choice="none")
    assert chained.output_text and chained.previous_response_id == called.id


def test_a_streamed_named_tool_call_arrives_as_argument_deltas(tandem: TandemServer) -> None:
    named = {"type": "function", "name": "get_weather"}
    stream = _client(tandem).responses.create(
        model="tandem", input=ASK, tools=TOOLS, tool_choice=named,
        max_output_tokens=60, stream=True, **GREEDY,
    )  # fmt: skip
    events = [STREAM_EVENT.validate_python(event.model_dump()) for event in stream]
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    (done,) = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert deltas and "".join(deltas) == done.arguments
    jsonschema.validate(json.loads(done.arguments), CITY_SCHEMA)
    assert "response.output_text.delta" not in [event.type for event in events]
    with _client(tandem).responses.stream(model="tandem", input=ASK, tools=TOOLS, tool_choice=named,
                                          max_output_tokens=60, **GREEDY) as helper:  # fmt: skip
        final = Response.model_validate(helper.get_final_response().model_dump())
    (call,) = _calls(final)
    assert final.status == "completed" and call.arguments == done.arguments


def test_three_turns_continue_one_conversation_through_the_prefix_cache(tandem: TandemServer) -> None:
    first = _create(tandem, input="My name is Ada. Say hello to me.", instructions=INSTRUCTIONS)
    turns = [first]
    for question in ("What is my name?", "Spell my name backwards."):
        hits_before = tandem.metric("tandem_prefix_cache_hits_tokens_total")
        previous = turns[-1]
        turn = _create(tandem, input=question, previous_response_id=previous.id, instructions=INSTRUCTIONS)
        hits = tandem.metric("tandem_prefix_cache_hits_tokens_total") - hits_before
        assert turn.previous_response_id == previous.id
        assert previous.usage is not None and turn.usage is not None
        seen = previous.usage.input_tokens + previous.usage.output_tokens
        assert turn.usage.input_tokens > seen, "the continued prompt does not hold the stored conversation"
        # Every whole block of the previous prompt is reused: the continuation extends it.
        assert hits >= previous.usage.input_tokens // 16 * 16, (hits, previous.usage.input_tokens)
        turns.append(turn)


def test_a_stored_response_is_retrieved_then_deleted(tandem: TandemServer) -> None:
    client = _client(tandem)
    created = _create(tandem, metadata={"case": "retrieve"})
    retrieved = client.responses.retrieve(created.id)
    assert Response.model_validate(retrieved.model_dump()) == created
    deleted = requests.delete(f"{tandem.base_url}/v1/responses/{created.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    unstored = _create(tandem, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_an_unknown_previous_response_is_404_and_unsupported_fields_are_400(tandem: TandemServer) -> None:
    client = _client(tandem)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="tandem", input="Hi", previous_response_id="resp_unknown")
    assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
    ]
    for fields, param in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tandem", input="Hi", **fields)
        assert refused.value.body["param"] == param  # type: ignore[index]
        assert f"`{param}`" in refused.value.body["message"]  # type: ignore[index]


@pytest.fixture(scope="module")
def tiny_store_tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    """A server keeping at most two responses."""
    log_path = tmp_path_factory.mktemp("tiny-store") / "launcher.log"
    flags = ["--model-cache-dir", str(model_cache_dir()), "--kv-cache-memory", "64MiB",
             "--responses-store-max-entries", "2"]  # fmt: skip
    server = TandemServer.start(log_path, *flags)
    yield server
    assert server.stop() == 0, server.log_tail()


def test_a_full_store_evicts_its_oldest_response(tiny_store_tandem: TandemServer) -> None:
    client = _client(tiny_store_tandem)
    created = [_create(tiny_store_tandem, max_output_tokens=2) for _ in range(3)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created[0].id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tandem", input="Hi", previous_response_id=created[0].id)
    for kept in created[1:]:
        assert client.responses.retrieve(kept.id).id == kept.id
    assert tiny_store_tandem.metric("tandem_responses_stored") == 2
    assert tiny_store_tandem.metric("tandem_responses_evicted_total") >= 1
    assert tiny_store_tandem.metric("tandem_responses_stored_bytes") > 0
