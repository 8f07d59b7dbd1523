"""The router renders tools, tool-call history, tool results and template switches through each family's real chat
template exactly as `transformers`' `apply_chat_template` does (the router's render entry point, through its native
module)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tandem_router._native import render_chat
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

TEMPLATES = Path(__file__).parent / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}}}}  # fmt: skip
CALL_ID = "abc123XYZ"  # Mistral's template requires 9 letters and digits
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
CALL = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": CALL_ID, "content": "Sunny, 21 °C"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And the time?"},
]
SPECIAL = {
    "qwen2.5": {},
    "qwen3": {},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "gpt-oss": {},
}


def _tokenizer(special: dict[str, str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built here: `apply_chat_template` needs one, the rendering does not use its vocabulary."""
    vocab = {"[UNK]": 0, **{token: index + 1 for index, token in enumerate(special.values())}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **special)


def _as_transformers_sees_them(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a `transformers` user passes them: call arguments as objects, no null content, reasoning
    under the name the template reads (gpt-oss's `thinking`)."""
    converted = copy.deepcopy(messages)
    for message in converted:
        if message.get("content") is None:
            message["content"] = ""
        if "reasoning_content" in message:
            message["thinking"] = message["reasoning_content"]
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return converted


def _both(family: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> tuple:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    special = SPECIAL[family]
    expected = _tokenizer(special).apply_chat_template(
        _as_transformers_sees_them(messages), tools=tools, chat_template=template, tokenize=False,
        add_generation_prompt=True, **kwargs,
    )  # fmt: skip
    body: dict[str, Any] = {"messages": messages}
    if tools is not None:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    rendered = render_chat(template, json.dumps(body), special.get("bos_token"), special.get("eos_token"))
    return rendered, expected


@pytest.mark.parametrize("family", sorted(SPECIAL))
def test_tools_render_as_transformers_renders_them(family: str) -> None:
    rendered, expected = _both(family, ASK, [WEATHER, TIME])
    assert rendered == expected
    assert "get_time" in rendered


@pytest.mark.parametrize("family", sorted(SPECIAL))
def test_call_history_and_tool_results_render_as_transformers_renders_them(family: str) -> None:
    rendered, expected = _both(family, HISTORY, [WEATHER, TIME])
    assert rendered == expected
    assert "Sunny, 21 °C" in rendered and "Paris" in rendered


@pytest.mark.parametrize("family", sorted(SPECIAL))
def test_a_conversation_without_tools_renders_as_transformers_renders_it(family: str) -> None:
    rendered, expected = _both(family, ASK, None)
    assert rendered == expected


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_the_thinking_switch_reaches_the_template(enable_thinking: bool) -> None:
    rendered, expected = _both("qwen3", HISTORY, [WEATHER], enable_thinking=enable_thinking)
    assert rendered == expected
    assert rendered.endswith("<think>\n\n</think>\n\n") != enable_thinking


def test_a_template_switch_outside_the_allow_list_is_refused() -> None:
    template = (TEMPLATES / "qwen3.jinja").read_text()
    body = {"messages": ASK, "chat_template_kwargs": {"add_generation_prompt": False}}
    with pytest.raises(ValueError, match=r"chat_template_kwargs\.add_generation_prompt"):
        render_chat(template, json.dumps(body))


def _gpt_oss(body: dict[str, Any], **kwargs: Any) -> tuple[str, str]:
    """gpt-oss's rendering of `body` by the router, and by `transformers` with the template variables `kwargs`."""
    template = (TEMPLATES / "gpt-oss.jinja").read_text()
    expected = _tokenizer({}).apply_chat_template(
        _as_transformers_sees_them(body["messages"]), tools=body.get("tools"), chat_template=template,
        tokenize=False, add_generation_prompt=True, **kwargs,
    )  # fmt: skip
    return render_chat(template, json.dumps(body)), expected


def test_gpt_oss_renders_the_prior_turns_reasoning_before_its_call_as_transformers_renders_it() -> None:
    history = copy.deepcopy(HISTORY[:4])
    history[2]["reasoning_content"] = "The user wants the weather; call get_weather."
    rendered, expected = _gpt_oss({"messages": history, "tools": [WEATHER, TIME]})
    assert rendered == expected
    assert "<|channel|>analysis<|message|>The user wants the weather" in rendered
    assert rendered.endswith("<|start|>assistant")


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_gpt_oss_takes_the_requests_reasoning_effort_through_its_template_variable(effort: str) -> None:
    rendered, expected = _gpt_oss({"messages": ASK, "reasoning_effort": effort}, reasoning_effort=effort)
    assert rendered == expected
    assert f"Reasoning: {effort}" in rendered
