"""Structured output through the real stack: OpenAI `response_format`, TGI `grammar`, and 4xx for bad grammars."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import conformance
import jsonschema
import openai
import pytest
import requests
from tandem_harness import TandemServer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "hobbies", "employed"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON: name, age, city, hobbies, employed."}]
SCHEMA_PARAM = "response_format.json_schema.schema"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def _client(tandem: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tandem.base_url}/v1", api_key="unused", timeout=300, max_retries=0)


def _sse_chunks(tandem: TandemServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with requests.post(f"{tandem.base_url}{path}", json=body, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        lines = [line for line in reply.iter_lines(decode_unicode=True) if line.startswith("data:")]
    payloads = [line[5:].strip() for line in lines]
    return [json.loads(payload) for payload in payloads if payload != "[DONE]"]


def test_json_schema_output_parses_and_validates_against_the_schema(tandem: TandemServer) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    completion = _client(tandem).chat.completions.create(
        model="tandem", messages=ASK_PERSON, max_tokens=200, temperature=0, response_format=response_format
    )
    conformance.openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_sampled_json_schema_choices_all_validate(tandem: TandemServer) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    completion = _client(tandem).chat.completions.create(
        model="tandem", messages=ASK_PERSON, max_tokens=200, temperature=1.0, seed=3, n=3,
        response_format=response_format,
    )  # fmt: skip
    assert len(completion.choices) == 3
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_streamed_json_object_concatenates_to_a_json_object(tandem: TandemServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Give me a JSON object with a colour and its hex code."}],
        # A penalty on repeats keeps the tiny model from looping on one key until the token limit.
        "max_tokens": 120, "temperature": 0, "frequency_penalty": 1.0, "stream": True,
        "response_format": {"type": "json_object"},
    }  # fmt: skip
    chunks = _sse_chunks(tandem, "/v1/chat/completions", body)
    for chunk in chunks:
        conformance.openai("CreateChatCompletionStreamResponse", chunk)
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop", text
    assert isinstance(json.loads(text), dict)


def test_tgi_regex_and_json_grammars_constrain_generate_and_generate_stream(tandem: TandemServer) -> None:
    body = {
        "inputs": "My phone number is",
        "parameters": {"max_new_tokens": 20, "grammar": {"type": "regex", "value": PHONE}, "details": True},
    }
    reply = requests.post(f"{tandem.base_url}/generate", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    assert re.fullmatch(PHONE, reply.json()["generated_text"])
    assert reply.json()["details"]["finish_reason"] == "eos_token"

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    stream_body = {
        "inputs": "Answer in JSON:",
        "parameters": {"max_new_tokens": 30, "grammar": {"type": "json", "value": schema}},
    }
    events = _sse_chunks(tandem, "/generate_stream", stream_body)
    generated = events[-1]["generated_text"]
    assert generated == "".join(event["token"]["text"] for event in events)
    jsonschema.validate(json.loads(generated), schema)


def test_tgi_json_schema_grammars_and_tgi_response_formats_constrain_output(tandem: TandemServer) -> None:
    grammar = {"type": "json_schema", "value": {"name": "person", "schema": PERSON}}
    body = {"inputs": "A person as JSON:", "parameters": {"max_new_tokens": 200, "grammar": grammar}}
    reply = requests.post(f"{tandem.base_url}/generate", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    jsonschema.validate(json.loads(reply.json()["generated_text"]), PERSON)

    # TGI's Messages API takes its grammar object as `response_format`; `json_object` there carries a schema.
    completion = _client(tandem).chat.completions.create(
        model="tandem", messages=ASK_PERSON, max_tokens=200, temperature=0,
        response_format={"type": "json_object", "value": PERSON},  # type: ignore[arg-type, typeddict-unknown-key]
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), PERSON)


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}, SCHEMA_PARAM),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "(a"}}}, SCHEMA_PARAM),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format"),
        ({"type": "xml"}, "response_format"),
        ({"type": "json_schema", "value": {"name": "x"}}, "response_format"),
        ({"type": "regex", "value": "(unclosed"}, "response_format.value"),
    ],
)  # fmt: skip
def test_bad_response_formats_are_400_with_their_param(
    tandem: TandemServer, response_format: dict[str, Any], param: str
) -> None:
    body = {"messages": ASK_PERSON, "max_tokens": 4, "response_format": response_format}
    reply = requests.post(f"{tandem.base_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_bad_and_pathological_tgi_grammars_are_422_and_the_server_still_serves(tandem: TandemServer) -> None:
    for grammar in (
        {"type": "regex", "value": "(unclosed"},
        {"type": "regex", "value": "a(?=b)"},
        {"type": "json", "value": "{not json"},
        {"type": "json", "value": {"type": "integer", "minimum": 5, "maximum": 1}},
        {"type": "yaml", "value": "x"},
        {"type": "json_schema", "value": {"name": "no schema"}},
        {"type": "json_schema", "value": {"schema": {"type": "objekt"}}},
    ):
        body = {"inputs": "x", "parameters": {"max_new_tokens": 4, "grammar": grammar}}
        reply = requests.post(f"{tandem.base_url}/generate", json=body, timeout=60)
        assert reply.status_code == 422, (grammar, reply.text)
        assert reply.json()["error_type"] == "validation"
    huge = {"type": "regex", "value": "((a|b|c|d){1,200}){1,200}[0-9]{1,1000}"}
    reply = requests.post(
        f"{tandem.base_url}/generate",
        json={"inputs": "x", "parameters": {"max_new_tokens": 4, "grammar": huge}},
        timeout=60,
    )
    assert reply.status_code in (200, 422), reply.text
    healthy = requests.post(
        f"{tandem.base_url}/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}}, timeout=60
    )
    assert healthy.status_code == 200, healthy.text


def test_constrained_requests_preempted_and_recomputed_still_match_their_grammar(
    tiny_kv_tandem: TandemServer,
) -> None:
    # Six requests of up to ~170 tokens need more than the ~512 tokens the tiny cache holds: some are preempted
    # and re-admitted, replaying their generated tokens into a fresh matcher on the shard.
    schema = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 999},
        "minItems": 40,
        "maxItems": 40,
    }
    preemptions_before = tiny_kv_tandem.metric("tandem_preemptions_total")

    def generate(seed: int) -> requests.Response:
        parameters = {
            "max_new_tokens": 200,
            "do_sample": True,
            "seed": seed,
            "grammar": {"type": "json", "value": schema},
        }
        return requests.post(
            f"{tiny_kv_tandem.base_url}/generate",
            json={"inputs": "Forty numbers:", "parameters": parameters},
            timeout=600,
        )

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(generate, range(6)))
    assert all(reply.status_code == 200 for reply in replies), [reply.text for reply in replies]
    assert tiny_kv_tandem.metric("tandem_preemptions_total") > preemptions_before
    for reply in replies:
        jsonschema.validate(json.loads(reply.json()["generated_text"]), schema)


def test_completions_follow_a_json_schema_response_format_for_every_prompt(tandem: TandemServer) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    completion = _client(tandem).completions.create(
        model="tandem",
        prompt=["A person described as JSON:", "Here is a JSON record of a friend:"],
        max_tokens=200,
        temperature=0,
        extra_body={"response_format": response_format},
    )
    conformance.openai("CreateCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    assert len(completion.choices) == 2
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), PERSON)
