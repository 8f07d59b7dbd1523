"""Bad requests get a 4xx JSON error naming the problem, and the server keeps serving."""

from __future__ import annotations

import pytest
import requests
from tandem_harness import MAX_INPUT_TOKENS, TandemServer

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]


def error_text(response: requests.Response) -> str:
    body = response.json()
    error = body["error"]
    return (error.get("message", "") if isinstance(error, dict) else str(error)).lower()


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        (CHAT, b'{"model": "tandem", "messages": [', "parsing"),
        (CHAT, {"model": "tandem", "max_tokens": 5}, "messages"),
        (CHAT, {"model": "tandem", "messages": USER, "max_tokens": -1}, "max_tokens"),
        ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": -1}}, "max_new_tokens"),
        (CHAT, {"model": "tandem", "messages": [{"role": "user", "content": "word " * 2000}]}, "token"),
        ("/v1/completions", {"model": "tandem", "prompt": "word " * 2000, "max_tokens": 4}, "token"),
    ],
)
def test_bad_request_gets_a_json_4xx_naming_the_problem(tandem: TandemServer, route, body, named) -> None:
    if isinstance(body, bytes):
        response = requests.post(
            f"{tandem.base_url}{route}", data=body, headers={"content-type": "application/json"}, timeout=30
        )
    else:
        response = requests.post(f"{tandem.base_url}{route}", json=body, timeout=30)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert named in error_text(response), response.text


def test_prompt_over_the_input_limit_names_the_limit(tandem: TandemServer) -> None:
    response = requests.post(f"{tandem.base_url}/generate", json={"inputs": "word " * 2000}, timeout=30)
    assert 400 <= response.status_code < 500
    assert str(MAX_INPUT_TOKENS) in error_text(response), response.text


def test_server_keeps_serving_and_frees_every_block_after_bad_input(tandem: TandemServer) -> None:
    requests.post(f"{tandem.base_url}{CHAT}", data=b"{nope", headers={"content-type": "application/json"}, timeout=30)
    requests.post(f"{tandem.base_url}/generate", json={"inputs": "word " * 2000}, timeout=30)
    assert tandem.generate_ids("The capital of France is", 4)
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=5) == 0


HOSTILE = [
    ("/v1/completions", b'{"model": "tandem", "prompt": "\xff\xfe"}', "unicode"),
    ("/v1/completions", b'{"model": "tandem", "prompt": ' + b"[" * 5000 + b'"a"' + b"]" * 5000 + b"}", "recursion"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "a", "temperature": NaN}', "expected value"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "a", "max_tokens": 1e400}', "out of range"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "a", "max_tokens": 100000}', "max_tokens"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "a", "logit_bias": {"abc": 1}}', "logit_bias"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    (CHAT, b'{"model": "tandem", "messages": [{"role": "wizard", "content": "a"}]}', "role"),
    (CHAT, b'{"model": "tandem", "messages": []}', "messages"),
    # 100k messages are 3.3 MB, over the default --payload-limit; 50k fit it and overflow the context instead.
    (CHAT, b'{"model": "tandem", "messages": [' + b'{"role": "user", "content": "a"},' * 99_999
     + b'{"role": "user", "content": "a"}]}', "payload limit"),
    (CHAT, b'{"model": "tandem", "messages": [' + b'{"role": "user", "content": "a"},' * 49_999
     + b'{"role": "user", "content": "a"}]}', "token"),
]  # fmt: skip


def test_hostile_bodies_get_4xx_and_the_server_stays_healthy(tandem: TandemServer) -> None:
    for route, body, named in HOSTILE:
        response = requests.post(
            f"{tandem.base_url}{route}", data=body, headers={"content-type": "application/json"}, timeout=120
        )
        assert 400 <= response.status_code < 500, (route, named, response.status_code, response.text[:200])
        assert named in error_text(response), response.text[:300]
    assert requests.get(f"{tandem.base_url}/health?deep=true", timeout=60).status_code == 200
    assert tandem.generate_ids("The capital of France is", 4)
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=5) == 0
