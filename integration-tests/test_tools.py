"""Tool calling through the real stack with the official `openai` SDK and raw SSE, in OpenAI's published shapes."""

from __future__ import annotations

import json
from typing import Any

import conformance
import jsonschema
import openai
import pytest
import requests
from tandem_harness import TandemServer, sse_lines

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                      "parameters": TIME_PARAMETERS}},
]  # fmt: skip
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(tandem: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tandem.base_url}/v1", api_key="unused", timeout=300, max_retries=0)


def _create(tandem: TandemServer, **fields: Any) -> Any:
    fields = {"messages": ASK, "max_tokens": 120, "temperature": 0, "tools": TOOLS, **fields}
    completion = _client(tandem).chat.completions.create(model="tandem", **fields)
    conformance.openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    return completion


def _assert_valid_calls(calls: Any, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_required_tool_call_is_parsed_by_the_sdk(tandem: TandemServer) -> None:
    choice = _create(tandem, tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    _assert_valid_calls(choice.message.tool_calls, set(PARAMETERS))


def test_named_tool_choice_calls_exactly_that_function_once(tandem: TandemServer) -> None:
    choice = _create(tandem, tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    _assert_valid_calls(choice.message.tool_calls, {"get_time"})


def test_tool_choice_none_answers_in_plain_text(tandem: TandemServer) -> None:
    choice = _create(tandem, tool_choice="none", max_tokens=16).choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_auto_answers_with_either_text_or_valid_calls(tandem: TandemServer) -> None:
    choice = _create(tandem, tool_choice="auto", max_tokens=60).choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _assert_valid_calls(choice.message.tool_calls, set(PARAMETERS))
    else:
        assert choice.message.content and not choice.message.content.startswith("{")


def test_parallel_calls_are_each_valid_and_serial_mode_allows_one(tandem: TandemServer) -> None:
    ask_both = [{"role": "user", "content": "Weather in Paris and in Rome, and the time in Tokyo?"}]
    parallel = _create(tandem, messages=ask_both, tool_choice="required", max_tokens=200).choices[0]
    _assert_valid_calls(parallel.message.tool_calls, set(PARAMETERS))
    serial = _create(tandem, messages=ask_both, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert len(serial.message.tool_calls) == 1


def test_streamed_tool_call_arrives_as_deltas_the_sdk_accumulates(tandem: TandemServer) -> None:
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120, "temperature": 0,
            "stream": True}  # fmt: skip
    with requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        payloads = [line[5:].strip() for line in sse_lines(reply) if line.startswith("data:")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)
    deltas = [entry for chunk in chunks for entry in chunk["choices"][0]["delta"].get("tool_calls", [])]
    openings = [entry for entry in deltas if "id" in entry]
    assert openings and all(entry["type"] == "function" and entry["function"]["name"] for entry in openings)
    fragments = [entry for entry in deltas if "id" not in entry]
    assert len(fragments) > 1, "arguments arrive incrementally"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    stream = _client(tandem).chat.completions.create(
        model="tandem", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0, stream=True
    )
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.function and call.function.name:
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + ((call.function and call.function.arguments) or "")
    assert names
    for index, name in names.items():
        jsonschema.validate(json.loads(arguments[index]), PARAMETERS[name])


def test_tool_results_in_the_history_render_and_the_model_answers(tandem: TandemServer) -> None:
    first = _create(tandem, tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    call = first.message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(mode="json")]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'},
    ]
    answer = _create(tandem, messages=history, tool_choice="none", max_tokens=20).choices[0]
    assert answer.message.content


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
            "tools",
        ),
    ],
)
def test_malformed_tool_requests_are_400_with_their_param(
    tandem: TandemServer, fields: dict[str, Any], param: str
) -> None:
    body = {"messages": ASK, "max_tokens": 4, **fields}
    reply = requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    healthy = requests.post(
        f"{tandem.base_url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}, timeout=60
    )
    assert healthy.status_code == 200
