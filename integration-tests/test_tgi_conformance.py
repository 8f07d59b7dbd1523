"""The native routes answer in TGI's published shapes: `/generate`, `/generate_stream`, `/tokenize`, `/info`,
errors; every `GenerateParameters` field either works or is refused by name."""

from __future__ import annotations

import json
from typing import Any

import conformance
import pytest
import requests
from tandem_harness import TandemServer

PROMPT = "The capital of France is"


def _generate(tandem: TandemServer, parameters: dict[str, Any]) -> requests.Response:
    return requests.post(f"{tandem.base_url}/generate", json={"inputs": PROMPT, "parameters": parameters}, timeout=300)


def test_generate_with_every_supported_parameter_validates(tandem: TandemServer) -> None:
    parameters = {
        "best_of": 2, "decoder_input_details": True, "details": True, "do_sample": True, "frequency_penalty": 0.1,
        "max_new_tokens": 4, "repetition_penalty": 1.1, "return_full_text": True, "seed": 3, "stop": ["\n\n"],
        "temperature": 0.7, "top_k": 20, "top_n_tokens": 2, "top_p": 0.9, "truncate": 4, "typical_p": 0.95,
        "watermark": False, "adapter_id": None,
    }  # fmt: skip
    response = _generate(tandem, parameters)
    assert response.status_code == 200, response.text
    body = response.json()
    conformance.tgi("GenerateResponse", body)
    details = body["details"]
    assert body["generated_text"].startswith(PROMPT)
    assert len(details["prefill"]) == 4, "truncate keeps the last 4 prompt tokens"
    assert len(details["best_of_sequences"]) == 1
    assert all(len(top) == 2 for top in details["top_tokens"])


def test_generate_stream_events_validate_and_the_last_carries_details(tandem: TandemServer) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "top_n_tokens": 2, "details": True}}
    with requests.post(f"{tandem.base_url}/generate_stream", json=body, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        events = [json.loads(data) for data in conformance.sse_events(reply.iter_lines(decode_unicode=True))]
    for event in events:
        conformance.tgi("StreamResponse", event)
    assert [event["index"] for event in events] == list(range(1, len(events) + 1))
    assert events[-1]["details"]["finish_reason"] in ("length", "eos_token", "stop_sequence")
    assert events[-1]["generated_text"] == "".join(event["token"]["text"] for event in events)


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"watermark": True}, "watermark"),
        ({"adapter_id": "my-lora"}, "adapter_id"),
        ({"best_of": 4, "do_sample": True}, "best_of"),
        ({"top_n_tokens": 6}, "top_n_tokens"),
        ({"truncate": 0}, "truncate"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_unsupported_or_out_of_range_parameters_are_422_naming_them(
    tandem: TandemServer, parameters: dict[str, Any], named: str
) -> None:
    response = _generate(tandem, parameters)
    assert response.status_code == 422, response.text
    conformance.tgi("ErrorResponse", response.json())
    assert f"`{named}`" in response.json()["error"]


def test_tokenize_matches_the_generate_prompt_and_validates(tandem: TandemServer) -> None:
    inputs = "Héllo, world"
    tokens = requests.post(f"{tandem.base_url}/tokenize", json={"inputs": inputs}, timeout=30).json()
    conformance.tgi("TokenizeResponse", tokens)
    for token in tokens:
        assert token["text"] == inputs[token["start"] : token["stop"]]
    prefill = _generate(tandem, {"max_new_tokens": 1, "details": True, "decoder_input_details": True})
    prompt_tokens = requests.post(f"{tandem.base_url}/tokenize", json={"inputs": PROMPT}, timeout=30).json()
    assert [token["id"] for token in prompt_tokens] == [token["id"] for token in prefill.json()["details"]["prefill"]]


def test_info_validates_and_reports_the_limits(tandem: TandemServer) -> None:
    info = tandem.info()
    conformance.tgi("Info", info)
    assert (info["max_stop_sequences"], info["max_best_of"], info["max_client_batch_size"]) == (4, 3, 4)
    assert info["payload_limit"] == 2_000_000
