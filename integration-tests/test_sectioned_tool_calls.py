# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars by design)
"""DeepSeek-V3.1's tool calls through the real stack: a random-weight Qwen2 given DeepSeek-V3.1's chat template and a
tokenizer holding its markers as special tokens. The router picks the `deepseek_v31` syntax and the `deepseek_v3`
reasoning format from the template, the grammar asks for the marker tokens, the detokenizer keeps them as text for the
parser, and every sampled call is a declared function with arguments valid under its schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
from tandem_harness import MAX_TOTAL_TOKENS, TandemServer, embedded_model_dir, sse_lines
from tool_call_cases import ASK, REQUESTS, SCHEMAS, TOOLS

DEEPSEEK_TEMPLATE = Path(__file__).parents[1] / "router/python/tests/chat_templates/deepseek-v3.1.jinja"
MARKERS = [
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
    "<｜User｜>", "<｜Assistant｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<think>", "</think>",
]  # fmt: skip


@pytest.fixture(scope="module")
def deepseek_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Qwen2 speaking the embedded model's tokenizer with DeepSeek-V3.1's markers added."""
    import torch  # noqa: PLC0415
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415
    from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415

    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    model_dir = tmp_path_factory.mktemp("qwen2-deepseek-v31")
    tokenizer = Tokenizer.from_file(str(embedded / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(marker, special=True, normalized=False) for marker in MARKERS])
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


@pytest.fixture(scope="module")
def deepseek(deepseek_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("deepseek-v31") / "launcher.log"
    server = TandemServer.start(
        log_path, "--model-id", str(deepseek_model), "--chat-template", str(DEEPSEEK_TEMPLATE),
        "--kv-cache-memory", "64MiB", "--dtype", "float32", "--quantize", "none",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def _body(seed: int, **fields: Any) -> dict[str, Any]:
    return {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 1.0, "seed": seed, "max_tokens": 200, **fields}  # fmt: skip


def _complete(server: TandemServer, seed: int, **fields: Any) -> dict[str, Any]:
    reply = requests.post(f"{server.base_url}/v1/chat/completions", json=_body(seed, **fields), timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _assert_declared_and_valid(calls: list[dict[str, Any]]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in SCHEMAS
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_the_template_picks_the_deepseek_formats_and_renders_the_prompt_as_transformers(
    deepseek: TandemServer, deepseek_model: Path
) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    log = deepseek.log_path.read_text()
    assert "tool calls use the deepseek_v31 syntax" in log
    assert "DeepseekV3" in log
    tokenizer = AutoTokenizer.from_pretrained(deepseek_model)
    expected = tokenizer.apply_chat_template(
        ASK, tools=TOOLS, chat_template=DEEPSEEK_TEMPLATE.read_text(), add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )["input_ids"]  # fmt: skip
    assert _complete(deepseek, 0)["usage"]["prompt_tokens"] == len(expected)


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(
    deepseek: TandemServer,
) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        completions = list(pool.map(lambda seed: _complete(deepseek, seed), range(REQUESTS)))
    for completion in completions:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        _assert_declared_and_valid(choice["message"]["tool_calls"])
    written = {json.dumps(c["choices"][0]["message"]["tool_calls"][0]["function"]) for c in completions}
    assert len(written) > 1


def test_a_streamed_call_rebuilds_the_same_calls_as_the_whole_answer(deepseek: TandemServer) -> None:
    whole = _complete(deepseek, 7)["choices"][0]["message"]["tool_calls"]
    body = _body(7, stream=True)
    with requests.post(f"{deepseek.base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
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


def test_a_call_follows_bounded_reasoning_when_thinking_is_switched_on(deepseek: TandemServer) -> None:
    for seed in range(3):
        completion = _complete(
            deepseek, seed, max_tokens=400, reasoning_effort="minimal", chat_template_kwargs={"enable_thinking": True}
        )
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert isinstance(choice["message"].get("reasoning_content"), str)
        assert "<｜tool" not in choice["message"]["reasoning_content"]
        _assert_declared_and_valid(choice["message"]["tool_calls"])
