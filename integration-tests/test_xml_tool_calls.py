"""Tool calls in the XML-style syntax of Qwen3-Coder (and Qwen3.5/3.6) through the real stack: a random-weight Qwen2
with Qwen3-Coder's chat template. The router tells the syntax apart from Hermes's by the template, renders the tools
through it, and the grammar alone makes every sampled call a declared function whose parameters, written raw or as
JSON by their schema, read back into arguments valid under that schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
from tandem_harness import TandemServer, embedded_model_dir, sse_lines
from test_native_tool_calls import hermes_model  # noqa: F401  (the module's model fixture)
from tool_call_cases import ASK, REQUESTS, SCHEMAS, TOOLS

CODER_TEMPLATE = Path(__file__).parents[1] / "router/python/tests/chat_templates/qwen3-coder.jinja"


@pytest.fixture(scope="module")
def coder(hermes_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:  # noqa: F811
    log_path = tmp_path_factory.mktemp("qwen3-coder") / "launcher.log"
    server = TandemServer.start(
        log_path, "--model-id", str(hermes_model), "--chat-template", str(CODER_TEMPLATE),
        "--kv-cache-memory", "64MiB", "--dtype", "float32", "--quantize", "none",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def _body(seed: int, **fields: Any) -> dict[str, Any]:
    return {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 1.0, "seed": seed, "max_tokens": 200, **fields}  # fmt: skip


def _complete(server: TandemServer, seed: int) -> dict[str, Any]:
    reply = requests.post(f"{server.base_url}/v1/chat/completions", json=_body(seed), timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_model_chooses_the_qwen3_coder_syntax_and_sees_the_tools_through_its_template(coder: TandemServer) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    assert "tool calls use the qwen3_coder syntax" in coder.log_path.read_text()
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    expected = tokenizer.apply_chat_template(
        ASK, tools=TOOLS, chat_template=CODER_TEMPLATE.read_text(), add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )["input_ids"]  # fmt: skip
    assert _complete(coder, 0)["usage"]["prompt_tokens"] == len(expected)


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(coder: TandemServer) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        completions = list(pool.map(lambda seed: _complete(coder, seed), range(REQUESTS)))
    names = set()
    for completion in completions:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        [call] = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
        names.add(name)
    assert names <= set(SCHEMAS)
    assert len({json.dumps(c["choices"][0]["message"]["tool_calls"][0]["function"]) for c in completions}) > 1


def test_a_streamed_call_rebuilds_the_same_call_as_the_whole_answer(coder: TandemServer) -> None:
    whole = _complete(coder, 7)["choices"][0]["message"]["tool_calls"][0]["function"]
    body = _body(7, stream=True)
    with requests.post(f"{coder.base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
        events = [line.removeprefix("data: ") for line in sse_lines(reply) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [call for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls") or []]
    assert [delta["function"]["name"] for delta in deltas if "id" in delta] == [whole["name"]]
    arguments = "".join(delta["function"]["arguments"] for delta in deltas if "id" not in delta)
    assert json.loads(arguments) == json.loads(whole["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
