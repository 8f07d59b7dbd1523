"""The tools, question and request count every family's grammar-enforcement test through the real stack uses, and the
requests and checks the sectioned families' and Gemma 4's tests share."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import requests
from tandem_harness import MAX_TOTAL_TOKENS, TandemServer, embedded_model_dir, sse_lines

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 12}},
    "required": ["timezone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": schema}}
         for name, schema in SCHEMAS.items()]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
REQUESTS = 50


def random_model_with_markers(model_dir: Path, markers: list[str]) -> Path:
    """A 2-layer random Qwen2 in `model_dir` speaking the embedded model's tokenizer with `markers` added as special
    tokens."""
    import torch  # noqa: PLC0415
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415
    from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415

    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(embedded / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(marker, special=True, normalized=False) for marker in markers])
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").symlink_to(embedded / "tokenizer_config.json")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=embedded_config["eos_token_id"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    return model_dir


def required_body(seed: int, **fields: Any) -> dict[str, Any]:
    """A seeded chat request that must call one of the tools."""
    return {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 1.0, "seed": seed, "max_tokens": 200, **fields}  # fmt: skip


def complete(server: TandemServer, seed: int, **fields: Any) -> dict[str, Any]:
    """`required_body`'s completion, which must succeed."""
    reply = requests.post(f"{server.base_url}/v1/chat/completions", json=required_body(seed, **fields), timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_declared_and_valid(calls: list[dict[str, Any]]) -> None:
    """Every call names a declared tool and has arguments valid under its schema."""
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in SCHEMAS
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def assert_streamed_calls_match(server: TandemServer, seed: int) -> None:
    """A streamed request rebuilds the calls of the same request answered whole, with no content."""
    whole = complete(server, seed)["choices"][0]["message"]["tool_calls"]
    body = required_body(seed, stream=True)
    with requests.post(f"{server.base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
        events = [line.removeprefix("data: ") for line in sse_lines(reply) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [call for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls") or []]
    names = [delta["function"]["name"] for delta in deltas if "id" in delta]
    assert names == [call["function"]["name"] for call in whole]
    for index, call in enumerate(whole):
        fragments = [d["function"]["arguments"] for d in deltas if d["index"] == index and "id" not in d]
        assert json.loads("".join(fragments)) == json.loads(call["function"]["arguments"])
    assert not any(chunk["choices"][0]["delta"].get("content") for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def serve_with_template(log_dir: Path, model_dir: Path, template: Path, *flags: str) -> Iterator[TandemServer]:
    """A float32 server of `model_dir` under `template` (a module fixture's body), stopped cleanly at the end."""
    server = TandemServer.start(
        log_dir / "launcher.log", "--model-id", str(model_dir), "--chat-template", str(template), *flags,
        "--kv-cache-memory", "64MiB", "--dtype", "float32", "--quantize", "none",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def transformers_prompt_tokens(model_dir: Path, template: str) -> int:
    """Tokens `transformers` renders for the standard request under `template`."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rendered = tokenizer.apply_chat_template(
        ASK, tools=TOOLS, chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return len(rendered["input_ids"])


def assert_sampled_required_calls_are_declared_and_valid(server: TandemServer) -> None:
    """`REQUESTS` seeded `required` requests each end in schema-valid calls of declared tools, and not all alike."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        completions = list(pool.map(lambda seed: complete(server, seed), range(REQUESTS)))
    for completion in completions:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        assert_declared_and_valid(choice["message"]["tool_calls"])
    written = {json.dumps(c["choices"][0]["message"]["tool_calls"][0]["function"]) for c in completions}
    assert len(written) > 1
