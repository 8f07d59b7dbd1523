"""A thousand generated bodies through the real router and shard, beside greedy streams.

A seeded generator mixes valid, boundary and invalid values of every field the generation routes take, including
the ones that reach the shard's sampler and grammar engine (min_tokens, stop_token_ids, ignore_eos, logit_bias,
logprobs, n, truncate, grammars, response_format, tools). Each body must get either a success or a client error:
no 5xx, no failed generation (424, or an error event of the shard's making in a stream), no shard restart, and
every greedy stream running meanwhile produces exactly the tokens it produces alone.

Valid bodies run the model and cost the run its time; most bodies with an invalid field are refused before it. So every
body drawn with an invalid value is sent, and of the valid ones the first VALID_BODIES_PER_ROUTE of each route: with
the seed below they hold every valid value of every field at least twice and 94% of the pairs of values that the
whole draw of valid bodies (about 370 a route) holds."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from tandem_harness import TandemServer

SEED = 20261201
DRAWS_PER_ROUTE = 500
VALID_BODIES_PER_ROUTE = 200
WORKERS = 8
# The embedded model's vocabulary (SmolLM2); ids at and above it must be refused, never looked up.
VOCAB_SIZE = 49152
STREAM_PROMPT = "List the planets of the solar system in order."
STREAM_TOKENS = 24
# Error types of a failure that is not the client's: the shard or the engine failed the request.
SERVER_SIDE_ERROR_TYPES = {"generation", "unhealthy", "shard_error", "server_error", "service_unavailable"}

PROMPTS = ["Hello", "", "The capital of France is", "ünïcödé ✓ 你好", "a " * 300, '{"json": [1, 2', "\n\t"]
# With the digits' ids (asked of the server), a digits-only grammar, min_tokens and stop_token_ids can leave a
# request no token to sample.
VALID_IDS = [0, 1, 2, 13, 28, 100, 4000, VOCAB_SIZE - 1]
INVALID_IDS = [VOCAB_SIZE, VOCAB_SIZE + 7, 2**31, 2**32 - 1]
COUNTS = [0, 1, 2, 3, 4]
BAD_COUNTS: list[Any] = [-1, 10**6, 2**63, "2", 2.5, True]
FLOATS = [0.0, 0.1, 0.7, 1.0, 1.3]
BAD_FLOATS: list[Any] = [-0.5, 1e9, -1e9, "0.5", [1.0]]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}},
          "required": ["n"]}  # fmt: skip
SCHEMAS: list[Any] = [SCHEMA, {"type": "string", "pattern": "[0-9]{2}"}, {"enum": ["a", "b"]},
                      {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}]  # fmt: skip
BAD_SCHEMAS: list[Any] = [{"type": "objekt"}, {"pattern": "(a"}, "not a schema", {"minimum": "x"}]
REGEXES = ["[0-9]{4}", "(yes|no)", "[a-z]+@[a-z]+\\.com", "x{1,3}", "[0-9]"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"]}}}  # fmt: skip


class Draw:
    """Values for one body: each field is valid unless the body's invalid rate picks one of its invalid values.

    Most bodies are entirely valid, so they reach the shard's sampler and grammar engine; the rest carry one or a
    few invalid fields, which validation must refuse with a 4xx."""

    def __init__(self, rng: random.Random, digit_ids: list[int]) -> None:
        self.rng = rng
        self.digit_ids = digit_ids
        self.valid_ids = [*VALID_IDS, *digit_ids]
        self.invalid_rate = rng.choice([0.0, 0.0, 0.0, 0.04, 0.15])
        self.drew_invalid = False

    def value(self, valid: list[Any], invalid: list[Any]) -> Any:
        if invalid and self.rng.random() < self.invalid_rate:
            self.drew_invalid = True
            return self.rng.choice(invalid)
        return self.rng.choice(valid)

    def maybe(self, body: dict[str, Any], name: str, valid: list[Any], invalid: list[Any], chance: float) -> None:
        """Sets `name` with probability `chance`."""
        if self.rng.random() < chance:
            body[name] = self.value(valid, invalid)

    def max_tokens(self) -> Any:
        """Small counts only (also for valid values), so the run stays bounded."""
        return self.value([1, 2, 3], [0, -1, 10**7, "4", 2.5])

    def token_ids(self, most: int) -> list[Any]:
        return [self.value(self.valid_ids, INVALID_IDS) for _ in range(self.rng.randint(0, most))]

    def logit_bias(self) -> Any:
        biases = [-100, -5, 0, 5, 100]
        entries = {str(token): self.value(biases, [1e9, "x", None]) for token in self.token_ids(4)}
        return self.value([entries], [{"not-an-id": 1}, [1, 2]])

    def response_format(self) -> Any:
        schema = self.value(SCHEMAS, BAD_SCHEMAS)
        return self.value(
            [{"type": "json_object"}, {"type": "text"}, {"type": "regex", "value": self.rng.choice(REGEXES)},
             {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
             {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}],
            [{"type": "grammar"}, "json", {"type": "regex", "value": "(a"}],
        )  # fmt: skip


def sampling_fields(draw: Draw, body: dict[str, Any]) -> None:
    """The fields both OpenAI routes share: sampling, stopping, and the vLLM extras."""
    draw.maybe(body, "temperature", FLOATS, BAD_FLOATS, 0.7)
    draw.maybe(body, "top_p", [0.1, 0.5, 0.9, 1.0], BAD_FLOATS, 0.3)
    draw.maybe(body, "top_k", [*COUNTS, 50], BAD_COUNTS, 0.3)
    draw.maybe(body, "min_p", [0.0, 0.05, 0.5], BAD_FLOATS, 0.2)
    draw.maybe(body, "seed", [0, 1, 42, 2**64 - 1], [-3, 2**64], 0.4)
    draw.maybe(body, "stop", ["\n", ["a", "b"], "the"], [[""], ["x" * 30] * 5, 7], 0.3)
    draw.maybe(body, "frequency_penalty", [-1.0, 0.0, 1.5], BAD_FLOATS, 0.2)
    draw.maybe(body, "presence_penalty", [-1.0, 0.0, 1.5], BAD_FLOATS, 0.2)
    draw.maybe(body, "repetition_penalty", [0.8, 1.0, 1.3], BAD_FLOATS, 0.2)
    draw.maybe(body, "min_tokens", [*COUNTS, 8], BAD_COUNTS, 0.4)
    draw.maybe(body, "ignore_eos", [True, False], ["yes"], 0.4)
    draw.maybe(body, "n", [1, 1, 2, 3], [0, 50, "2"], 0.4)
    draw.maybe(body, "stop_token_ids", [draw.token_ids(6), draw.digit_ids], ["2", [[1]], [0.5], [-1]], 0.4)
    draw.maybe(body, "logit_bias", [draw.logit_bias()], [], 0.4)
    draw.maybe(body, "response_format", [draw.response_format()], [], 0.4)


def chat_body(draw: Draw) -> dict[str, Any]:
    rng = draw.rng
    content = draw.value([*PROMPTS, [{"type": "text", "text": "Hi"}]], [None, 5, [{"type": "image"}]])
    role = draw.value(["user", "user", "system"], ["robot", ""])
    messages = draw.value([[{"role": role, "content": content}]], [[], "hi"])
    body: dict[str, Any] = {"model": "tandem", "messages": messages}
    body["max_tokens"] = draw.max_tokens()
    draw.maybe(body, "stream", [True, False], [], 0.5)
    draw.maybe(body, "logprobs", [True, False], [1], 0.3)
    draw.maybe(body, "top_logprobs", [0, 2, 5], [21, -1], 0.2)
    if rng.random() < 0.25:
        body["tools"] = draw.value([[TOOL], [TOOL, TOOL]], [[{"type": "function"}], "tools"])
        named = {"type": "function", "function": {"name": "get_weather"}}
        missing = {"type": "function", "function": {"name": "missing"}}
        draw.maybe(body, "tool_choice", ["auto", "none", "required", named], [missing, "always"], 0.7)
    sampling_fields(draw, body)
    return body


def completion_body(draw: Draw) -> dict[str, Any]:
    rng = draw.rng
    prompt = draw.value([*PROMPTS, [rng.choice(PROMPTS), "Once"], [[1, 2, 3]], [draw.token_ids(3)]], [None, [[-1]]])
    body: dict[str, Any] = {"model": "tandem", "prompt": prompt, "max_tokens": draw.max_tokens()}
    draw.maybe(body, "stream", [True, False], [], 0.5)
    draw.maybe(body, "logprobs", [0, 1, 3, 5], [6, -1, True], 0.3)
    draw.maybe(body, "echo", [True, False], ["no"], 0.2)
    draw.maybe(body, "best_of", [1, 2, 3], [0, 4], 0.2)
    sampling_fields(draw, body)
    return body


def generate_body(draw: Draw) -> dict[str, Any]:
    rng = draw.rng
    parameters: dict[str, Any] = {"max_new_tokens": draw.max_tokens()}
    draw.maybe(parameters, "temperature", FLOATS[1:], [*BAD_FLOATS, 0.0], 0.5)
    draw.maybe(parameters, "do_sample", [True, False], [], 0.4)
    draw.maybe(parameters, "top_k", [1, 5, 50], BAD_COUNTS, 0.3)
    draw.maybe(parameters, "top_p", [0.1, 0.5, 0.9], BAD_FLOATS, 0.3)
    draw.maybe(parameters, "typical_p", [0.2, 0.9], BAD_FLOATS, 0.2)
    draw.maybe(parameters, "repetition_penalty", [1.0, 1.2], BAD_FLOATS, 0.2)
    draw.maybe(parameters, "frequency_penalty", [0.0, 0.5], BAD_FLOATS, 0.2)
    draw.maybe(parameters, "seed", [0, 7], [-1], 0.3)
    draw.maybe(parameters, "stop", [["\n"], ["a", "b"]], [["a", "b", "c", "d", "e"], "x"], 0.3)
    draw.maybe(parameters, "truncate", [1, 5, 900], [-1, 10**7, "3"], 0.4)
    draw.maybe(parameters, "details", [True, False], [], 0.5)
    draw.maybe(parameters, "decoder_input_details", [True, False], [], 0.3)
    draw.maybe(parameters, "top_n_tokens", [0, 1, 5], [6, -1], 0.3)
    draw.maybe(parameters, "best_of", [1, 2], [3, 9], 0.2)
    draw.maybe(parameters, "return_full_text", [True, False], [], 0.2)
    grammars = [{"type": "json", "value": draw.value(SCHEMAS, BAD_SCHEMAS)},
                {"type": "regex", "value": rng.choice(REGEXES)}, {"type": "json_object", "value": {}}]  # fmt: skip
    draw.maybe(parameters, "grammar", grammars, [{"type": "lark", "value": "start: x"}, {"type": "regex"}], 0.35)
    return {"inputs": draw.value(PROMPTS[:4] + PROMPTS[5:], [PROMPTS[4] * 4]), "parameters": parameters}


ROUTES = {"/generate": generate_body, "/v1/completions": completion_body, "/v1/chat/completions": chat_body}


def server_side_events(text: str) -> list[str]:
    """Error events in an SSE body whose type says the server, not the request, failed."""
    found = []
    for line in text.split("\n"):  # only "\n" ends an event line; the text may hold U+2028 and the like
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            found.append(f"unparsable event {line[:80]!r}")
            continue
        error = event.get("error") if isinstance(event, dict) else None
        kind = event.get("error_type") if isinstance(event, dict) else None
        if isinstance(error, dict):
            kind = error.get("type")
        if error is not None and kind in SERVER_SIDE_ERROR_TYPES:
            found.append(f"{kind}: {str(error)[:120]}")
    return found


def send(base_url: str, route: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """The status and any server-side error events of one request."""
    with requests.post(f"{base_url}{route}", json=body, timeout=300, stream=bool(body.get("stream"))) as reply:
        content = reply.content
    if reply.status_code != 200:
        return reply.status_code, []
    try:
        return reply.status_code, server_side_events(content.decode("utf-8"))
    except UnicodeDecodeError as error:
        return reply.status_code, [f"a body that is not UTF-8: {error}"]


def drawn_cases(rng: random.Random, digit_ids: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """Of DRAWS_PER_ROUTE draws a route: every body with an invalid value, the first VALID_BODIES_PER_ROUTE valid."""
    cases = []
    for route, build in ROUTES.items():
        valid = 0
        for _ in range(DRAWS_PER_ROUTE):
            draw = Draw(rng, digit_ids)
            body = build(draw)
            if draw.drew_invalid or valid < VALID_BODIES_PER_ROUTE:
                valid += not draw.drew_invalid
                cases.append((route, body))
    return cases


def digit_token_ids(tandem: TandemServer) -> list[int]:
    ids = []
    for digit in "0123456789":
        response = requests.post(f"{tandem.base_url}/tokenize", json={"inputs": digit}, timeout=30)
        assert response.status_code == 200, response.text
        ids += [token["id"] for token in response.json()]
    return ids


def greedy_streams(tandem: TandemServer, stop: threading.Event, outputs: list[Any]) -> None:
    """Greedy streams one after another until `stop`; a stream that fails is kept as its error."""
    while not stop.is_set():
        try:
            outputs.append(tandem.stream_ids(STREAM_PROMPT, STREAM_TOKENS))
        except (AssertionError, KeyError, ValueError, requests.RequestException) as error:
            outputs.append(f"the stream failed: {error!r}")


def test_generated_bodies_through_the_real_stack_fail_only_themselves(tandem: TandemServer) -> None:
    alone = tandem.stream_ids(STREAM_PROMPT, STREAM_TOKENS)
    recoveries_before = tandem.metric("tandem_shard_recoveries_total")
    rng, digit_ids = random.Random(SEED), digit_token_ids(tandem)
    cases = drawn_cases(rng, digit_ids)
    rng.shuffle(cases)
    stop, streamed = threading.Event(), list[Any]()
    streams = threading.Thread(target=greedy_streams, args=(tandem, stop, streamed))
    started = time.monotonic()
    streams.start()
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            results = list(pool.map(lambda case: send(tandem.base_url, *case), cases))
    finally:
        stop.set()
        streams.join(timeout=300)
    elapsed = time.monotonic() - started
    statuses = Counter(status for status, _ in results)
    failed = [
        f"{route} -> {status} {events}: {json.dumps(body)[:400]}"
        for (route, body), (status, events) in zip(cases, results, strict=True)
        if status >= 500 or status in (424, 429) or events
    ]
    print(f"\n{len(cases)} bodies in {elapsed:.0f}s, statuses {dict(sorted(statuses.items()))}, "
          f"{len(streamed)} greedy streams beside them")  # fmt: skip
    assert not failed, f"{len(failed)} bodies failed on the server's side:\n" + "\n".join(failed[:40])
    assert tandem.metric("tandem_shard_recoveries_total") == recoveries_before
    assert streamed and [output for output in streamed if output != alone] == []
    assert statuses[200] >= len(cases) // 4, statuses
    assert requests.get(f"{tandem.base_url}/health", timeout=10).status_code == 200
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=10) == 0
