"""`n` choices and `best_of` candidates through the real stack: seeded per choice, prompt blocks shared."""

from __future__ import annotations

import json
from typing import Any

import conformance
import requests
from tandem_harness import TandemServer, sse_lines

BLOCK_SIZE = 16
PROMPT = (
    "A lighthouse keeper writes in her log every evening. She notes the wind, the colour of the sea, the ships that "
    "passed, the state of the lamp and the number of gulls on the rail. Tonight the wind is from the west, the sea "
    "is grey and calm, two fishing boats came home before dark and the lamp is clean. She ends the entry with "
    "a short sentence about tomorrow:"
)
SEED = 1234
MAX_TOKENS = 12


def _post(tandem: TandemServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(f"{tandem.base_url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def _sampled(n: int, seed: int) -> dict[str, Any]:
    return {"prompt": PROMPT, "n": n, "seed": seed, "temperature": 0.9, "max_tokens": MAX_TOKENS, "logprobs": 0}


def _tokens(choice: dict[str, Any]) -> list[str]:
    return choice["logprobs"]["tokens"]


def test_n_seeded_choices_equal_separate_requests_and_share_the_prompt_blocks(tandem: TandemServer) -> None:
    hits_before = tandem.metric("tandem_prefix_cache_hits_tokens_total")
    together = _post(tandem, "/v1/completions", _sampled(3, SEED))
    hits_after = tandem.metric("tandem_prefix_cache_hits_tokens_total")
    conformance.openai("CreateCompletionResponse", together)

    choices = together["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    prompt_tokens = together["usage"]["prompt_tokens"]
    # Two siblings each adopt every full block of the prompt the leader computed (one token is always computed).
    shared_tokens = (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert shared_tokens >= 4 * BLOCK_SIZE
    assert hits_after - hits_before >= 2 * shared_tokens
    assert together["usage"]["completion_tokens"] == sum(len(_tokens(choice)) for choice in choices)
    for index, choice in enumerate(choices):
        alone = _post(tandem, "/v1/completions", _sampled(1, SEED + index))["choices"][0]
        assert _tokens(choice) == _tokens(alone), f"choice {index} differs from a request seeded {SEED + index}"
        assert choice["text"] == alone["text"]
        assert choice["finish_reason"] == alone["finish_reason"]
    assert len({tuple(_tokens(choice)) for choice in choices}) > 1, "differently seeded choices all agree"
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=5) == 0


def test_streamed_chat_choices_equal_the_non_streamed_ones(tandem: TandemServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Name a fruit and a colour."}],
        "n": 2,
        "seed": 7,
        "temperature": 1.0,
        "max_tokens": 10,
    }
    whole = _post(tandem, "/v1/chat/completions", body)
    conformance.openai("CreateChatCompletionResponse", whole)
    texts = {index: "" for index in range(2)}
    finishes: dict[int, str] = {}
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with requests.post(f"{tandem.base_url}/v1/chat/completions", json=stream_body, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        for line in sse_lines(reply):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            conformance.openai("CreateChatCompletionStreamResponse", chunk)
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                texts[choice["index"]] += choice["delta"].get("content", "")
                if choice["finish_reason"]:
                    finishes[choice["index"]] = choice["finish_reason"]
    for choice in whole["choices"]:
        assert texts[choice["index"]] == choice["message"]["content"]
        assert finishes[choice["index"]] == choice["finish_reason"]
    # The streamed request may find the first one's prompt in the prefix cache; the counts are the same.
    assert (
        usage.pop("prompt_tokens_details")["cached_tokens"]
        >= whole["usage"].pop("prompt_tokens_details")["cached_tokens"]
    )
    assert usage == whole["usage"]


def test_best_of_returns_the_most_likely_candidate_and_lists_the_others(tandem: TandemServer) -> None:
    parameters = {"best_of": 3, "do_sample": True, "seed": SEED, "max_new_tokens": 8, "details": True}
    details = _post(tandem, "/generate", {"inputs": PROMPT, "parameters": parameters})["details"]
    others = details["best_of_sequences"]
    assert sorted([details["seed"]] + [other["seed"] for other in others]) == [SEED, SEED + 1, SEED + 2]

    def cumulative(candidate: dict[str, Any]) -> float:
        return sum(token["logprob"] for token in candidate["tokens"])

    assert all(cumulative(details) >= cumulative(other) for other in others)
    for other in others:
        alone = {**parameters, "best_of": 1, "seed": other["seed"]}
        expected = _post(tandem, "/generate", {"inputs": PROMPT, "parameters": alone})["details"]["tokens"]
        assert [token["id"] for token in other["tokens"]] == [token["id"] for token in expected]
