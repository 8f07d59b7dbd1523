"""gpt-oss's harmony format through the real stack: a tiny random gpt-oss whose tokenizer holds harmony's markers as
special tokens, with gpt-oss's own chat template. The router finds the format in the template, renders the tools and
the reasoning effort through it, holds the output to harmony's channels with a grammar, and reads the `analysis`
channel as reasoning and each `commentary` call to `functions.NAME` as a tool call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import torch
from tandem_harness import FLOAT32_EAGER, TandemServer, embedded_model_dir, sse_lines
from tool_call_cases import ASK, REQUESTS, SCHEMAS, TOOLS
from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM

GPT_OSS_TEMPLATE = Path(__file__).parents[1] / "router/python/tests/chat_templates/gpt-oss.jinja"
MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]


def _special(token_id: int, content: str) -> dict[str, Any]:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}  # fmt: skip


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tokenizer with harmony's markers added after its vocabulary as special tokens, gpt-oss's chat
    template, and a small random gpt-oss over that vocabulary that stops at `<|return|>` and `<|call|>`."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp("gpt-oss")
    tokenizer = json.loads((embedded / "tokenizer.json").read_text())
    vocab_size = len(tokenizer["model"]["vocab"])
    ids = {marker: vocab_size + index for index, marker in enumerate(MARKERS)}
    tokenizer["added_tokens"] += [_special(token_id, marker) for marker, token_id in ids.items()]
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    tokenizer_config = json.loads((embedded / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (model_dir / "chat_template.jinja").write_text(GPT_OSS_TEMPLATE.read_text())
    embedded_config = json.loads((embedded / "config.json").read_text())
    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=vocab_size + len(MARKERS), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=16, max_position_embeddings=2048,
        bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=[ids["<|return|>"], ids["<|call|>"], embedded_config["eos_token_id"]],
        tie_word_embeddings=False,
    )  # fmt: skip
    GptOssForCausalLM(config).save_pretrained(model_dir)
    return model_dir


@pytest.fixture(scope="module")
def gpt_oss(gpt_oss_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("gpt-oss-server") / "launcher.log"
    server = TandemServer.start(
        log_path, "--model-id", str(gpt_oss_dir), *FLOAT32_EAGER, "--kv-cache-memory", "64MiB",
        "--max-total-tokens", "2048",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def _body(seed: int, **fields: Any) -> dict[str, Any]:
    return {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": seed,
            "max_tokens": 200, "reasoning_effort": "none", **fields}  # fmt: skip


def _complete(server: TandemServer, body: dict[str, Any]) -> dict[str, Any]:
    reply = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _check_call(call: dict[str, Any]) -> str:
    assert call["type"] == "function" and call["id"].startswith("call_")
    name: str = call["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    return name


def test_the_template_shows_harmony_and_the_prompt_is_the_one_transformers_renders(
    gpt_oss: TandemServer, gpt_oss_dir: Path
) -> None:
    log = gpt_oss.log_path.read_text()
    assert "tool calls use the openai syntax" in log
    tokenizer = AutoTokenizer.from_pretrained(gpt_oss_dir)
    # The request's effort `none` is a reasoning budget of 0 and the template's lowest level.
    expected = tokenizer.apply_chat_template(
        ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=True, reasoning_effort="low",
    )["input_ids"]  # fmt: skip
    assert _complete(gpt_oss, _body(0))["usage"]["prompt_tokens"] == len(expected)


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(gpt_oss: TandemServer) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        completions = list(pool.map(lambda seed: _complete(gpt_oss, _body(seed)), range(REQUESTS)))
    names = set()
    for completion in completions:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        [call] = choice["message"]["tool_calls"]
        names.add(_check_call(call))
    assert names <= set(SCHEMAS)
    assert len({json.dumps(c["choices"][0]["message"]["tool_calls"][0]["function"]) for c in completions}) > 1


def test_streamed_reasoning_then_a_call_rebuild_the_whole_answer(gpt_oss: TandemServer) -> None:
    """`minimal` effort bounds the analysis at 256 tokens: a random model never ends it itself, so the grammar ends
    it, and the required call follows."""
    body = _body(5, reasoning_effort="minimal", max_tokens=400)
    completion = _complete(gpt_oss, body)
    whole = completion["choices"][0]
    assert whole["finish_reason"] == "tool_calls", whole
    assert 0 < completion["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 258
    assert whole["message"]["reasoning_content"]
    with requests.post(f"{gpt_oss.base_url}/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=300) as reply:  # fmt: skip
        events = [line.removeprefix("data: ") for line in sse_lines(reply) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    choices = [json.loads(event)["choices"][0] for event in events[:-1] if json.loads(event)["choices"]]
    reasoning = "".join(choice["delta"].get("reasoning_content") or "" for choice in choices)
    assert reasoning == whole["message"]["reasoning_content"]
    assert not any(marker in reasoning for marker in MARKERS)
    name, arguments = "", ""
    for choice in choices:
        for call in choice["delta"].get("tool_calls") or []:
            name += call["function"].get("name") or ""
            arguments += call["function"].get("arguments") or ""
    assert {"name": name, "arguments": arguments} == whole["message"]["tool_calls"][0]["function"]
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert not any(choice["delta"].get("content") for choice in choices)
