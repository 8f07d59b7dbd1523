"""200 mixed requests at once: greedy outputs stay what they are alone, and every KV block comes back."""

from __future__ import annotations

import http.client
import json
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import requests
from reference import Reference
from tandem_harness import TandemServer

TOTAL_REQUESTS = 200
CONCURRENCY = 16
MAX_NEW_TOKENS = 8
SUBJECTS = ("otters", "copper", "violins", "deserts", "lanterns", "honey", "glaciers", "kites", "mushrooms", "trains")
# One greedy body per subject; some with penalties or alternatives, which must not change with batching either.
GREEDY_EXTRAS: tuple[dict[str, Any], ...] = (
    {},
    {"repetition_penalty": 1.3},
    {},
    {"frequency_penalty": 0.5},
    {"top_n_tokens": 3},
    {},
    {"decoder_input_details": True},
    {},
    {"repetition_penalty": 1.1, "top_n_tokens": 2},
    {},
)


def _greedy_body(index: int) -> dict[str, Any]:
    parameters = {"max_new_tokens": MAX_NEW_TOKENS, "details": True, **GREEDY_EXTRAS[index]}
    return {"inputs": f"Three short facts about {SUBJECTS[index]}:", "parameters": parameters}


def _generate_ids(base_url: str, body: dict[str, Any]) -> list[int]:
    response = requests.post(f"{base_url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return [token["id"] for token in response.json()["details"]["tokens"]]


def _stream_ids(base_url: str, body: dict[str, Any]) -> list[int]:
    ids = []
    with requests.post(f"{base_url}/generate_stream", json=body, stream=True, timeout=300) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[len("data:") :])
                assert "error" not in event, event
                ids.append(event["token"]["id"])
    return ids


def _sampled(base_url: str, rng: random.Random, index: int) -> None:
    """A sampled OpenAI request, some with several choices, penalties or logprobs; checks its shape."""
    n = rng.choice((1, 1, 2, 3))
    body: dict[str, Any] = {"n": n, "seed": index, "temperature": 0.9, "max_tokens": MAX_NEW_TOKENS}
    if rng.random() < 0.5:
        body |= {"presence_penalty": 0.4, "frequency_penalty": 0.3}
    if rng.random() < 0.5:
        path, body["prompt"], body["logprobs"] = "/v1/completions", f"Story {index} begins:", 2
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"Say something {index}."}]
        body |= {"logprobs": True, "top_logprobs": 2}
    response = requests.post(f"{base_url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert sorted(choice["index"] for choice in choices) == list(range(n))
    assert all(choice["finish_reason"] in ("stop", "length") for choice in choices)


def _cancelled(base_url: str, index: int) -> None:
    """A long streamed request whose client goes away after its first chunks."""
    url = urlparse(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    body = {"prompt": f"Write a long tale number {index}:", "max_tokens": 400, "stream": True, "n": 1 + index % 2}
    connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    chunks = 0
    while chunks < 2:
        line = response.readline()
        assert line, "the stream ended before it could be cancelled"
        chunks += line.startswith(b"data:")
    assert connection.sock is not None
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()


def test_two_hundred_mixed_requests_keep_greedy_outputs_and_free_every_block(
    tandem: TandemServer, reference: Reference
) -> None:
    base_url = tandem.base_url
    alone = [_generate_ids(base_url, _greedy_body(index)) for index in range(len(SUBJECTS))]
    rng = random.Random(0)
    jobs: list[tuple[str, int]] = []
    for index in range(TOTAL_REQUESTS):
        roll = rng.random()
        kind = "cancelled" if roll < 0.1 else "greedy" if roll < 0.55 else "sampled"
        jobs.append((kind, index))

    def run(job: tuple[str, int]) -> tuple[int, list[int]] | None:
        kind, index = job
        if kind == "cancelled":
            _cancelled(base_url, index)
            return None
        if kind == "sampled":
            _sampled(base_url, random.Random(index), index)
            return None
        subject = index % len(SUBJECTS)
        fetch = _stream_ids if index % 2 else _generate_ids
        return subject, fetch(base_url, _greedy_body(subject))

    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        results = list(pool.map(run, jobs))

    greedy = [result for result in results if result is not None]
    assert len(greedy) >= 60
    assert sum(kind == "cancelled" for kind, _ in jobs) >= 10
    for subject, ids in greedy:
        reference.assert_same_greedy(_greedy_body(subject)["inputs"], alone[subject], ids)
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=10) == 0
