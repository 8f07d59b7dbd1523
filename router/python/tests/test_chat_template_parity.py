"""The router renders tools, tool-call history, tool results and template switches through each family's real chat
template exactly as `transformers`' `apply_chat_template` does (the router's render entry point, through its native
module)."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars by design)
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
    "deepseek-v3.1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "kimi-k2-thinking": {"eos_token": "<|im_end|>"},
    "qwen3-coder": {},
    "qwen3.5": {},
    "glm-4.6": {},
    "gpt-oss": {},
    "gemma-4": {"bos_token": "<bos>", "eos_token": "<eos>"},
}
# Families whose published template leaves `tools` out of the prompt (DeepSeek-V3.1's model card describes them in the
# system message instead).
TOOLS_NOT_SHOWN = {"deepseek-v3.1"}
# Families whose templates take a call's arguments as the client's JSON text (DeepSeek-V3.1's concatenates it).
ARGUMENTS_AS_TEXT = {"deepseek-v3.1", "kimi-k2-thinking"}


def _tokenizer(special: dict[str, str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built here: `apply_chat_template` needs one, the rendering does not use its vocabulary."""
    vocab = {"[UNK]": 0, **{token: index + 1 for index, token in enumerate(special.values())}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **special)


def _as_transformers_sees_them(messages: list[dict[str, Any]], arguments_as_text: bool = False) -> list[dict[str, Any]]:
    """The messages as a `transformers` user passes them: call arguments as objects (or as the JSON text the family's
    template reads), no null content, reasoning under the name the template reads (gpt-oss's `thinking`)."""
    converted = copy.deepcopy(messages)
    for message in converted:
        if message.get("content") is None:
            message["content"] = ""
        if "reasoning_content" in message:
            message["thinking"] = message["reasoning_content"]
        for call in message.get("tool_calls", []):
            if not arguments_as_text:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return converted


def _both(family: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> tuple:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    special = SPECIAL[family]
    converted = _as_transformers_sees_them(messages, family in ARGUMENTS_AS_TEXT)
    expected = _tokenizer(special).apply_chat_template(
        converted, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs,
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
    assert ("get_time" in rendered) != (family in TOOLS_NOT_SHOWN)


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


@pytest.mark.parametrize(("family", "closed"), [("qwen3.5", "<think>\n\n</think>\n\n"), ("glm-4.6", "<think></think>")])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_the_thinking_switch_reaches_the_xml_families_templates(
    family: str, closed: str, enable_thinking: bool
) -> None:
    rendered, expected = _both(family, HISTORY, [WEATHER], enable_thinking=enable_thinking)
    assert rendered == expected
    assert rendered.endswith(closed) != enable_thinking


@pytest.mark.parametrize("family", ["qwen3-coder", "qwen3.5", "glm-4.6"])
def test_xml_call_history_writes_strings_raw_and_other_values_as_json_as_transformers_does(family: str) -> None:
    arguments = {"city": "Zürich", "days": 3, "units": ["celsius"]}
    call = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    second = {**copy.deepcopy(call), "id": "def456XYZ"}
    calls = {"role": "assistant", "content": "Checking.", "tool_calls": [call, second]}
    results = [{"role": "tool", "tool_call_id": CALL_ID, "content": "Sunny"}, {"role": "tool", "content": "Rain"}]
    history = [*ASK, calls, *results]
    rendered, expected = _both(family, history, [WEATHER, TIME])
    assert rendered == expected
    assert "Zürich" in rendered and '["celsius"]' in rendered


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_gemma4_history_writes_its_own_value_syntax_and_the_switch_opens_or_closes_the_thought_channel(
    enable_thinking: bool,
) -> None:
    arguments = {"days": 3, "city": "Zürich", "where": {"lat": 1.5, "tags": ["a", "b"]}, "exact": True, "tz": None}
    call = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    calls = {"role": "assistant", "content": None, "tool_calls": [call, {**copy.deepcopy(call), "id": "def456XYZ"}]}
    results = [{"role": "tool", "tool_call_id": call_id, "content": weather} for call_id, weather in
               [(CALL_ID, "Sunny"), ("def456XYZ", "Rain")]]  # fmt: skip
    history = [*ASK, calls, *results, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Time?"}]
    rendered, expected = _both("gemma-4", history, [WEATHER, TIME], enable_thinking=enable_thinking)
    assert rendered == expected
    assert '<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>,days:3,exact:true,tz:' in rendered
    assert 'where:{lat:1.5,tags:[<|"|>a<|"|>,<|"|>b<|"|>]}}<tool_call|><|tool_call>call:get_weather{' in rendered
    assert rendered.endswith("<|channel>thought\n<channel|>") != enable_thinking
    assert ("<|think|>" in rendered) == enable_thinking


def _smollm3(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> tuple:
    """SmolLM3's template reads the tools as `xml_tools`, which is how its users pass them to `transformers`; the
    router hands a request's `tools` to it under that name too."""
    template = (TEMPLATES / "smollm3.jinja").read_text()
    expected = _tokenizer({}).apply_chat_template(
        _as_transformers_sees_them(messages), tools=tools, xml_tools=tools, chat_template=template, tokenize=False,
        add_generation_prompt=True, **kwargs,
    )  # fmt: skip
    body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return render_chat(template, json.dumps(body)), expected


def test_smollm3_sees_the_tools_as_python_writes_them_and_its_history_as_transformers_renders_it() -> None:
    rendered, expected = _smollm3(HISTORY, [WEATHER, TIME])
    assert rendered == expected
    assert "{'type': 'function', 'function': {'name': 'get_weather'" in rendered
    assert "Today Date: " in rendered and "Sunny, 21 °C" in rendered


@pytest.mark.parametrize(
    ("system", "enable_thinking", "thinks"),
    [("Be brief.", None, True), ("Be brief.", False, False), ("Be brief. /no_think", None, False),
     ("Be brief. /think", False, True)],
)  # fmt: skip
def test_smollm3_thinks_by_its_system_flags_and_the_template_switch(
    system: str, enable_thinking: bool | None, thinks: bool
) -> None:
    messages = [{"role": "system", "content": system}, ASK[1]]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    rendered, expected = _smollm3(messages, None, **kwargs)
    assert rendered == expected
    assert rendered.endswith("<think>\n\n</think>\n") != thinks
    assert f"Reasoning Mode: {'/think' if thinks else '/no_think'}\n" in rendered
    assert "## Custom Instructions\n\nBe brief.\n\n" in rendered


def test_a_template_switch_outside_the_allow_list_is_refused() -> None:
    template = (TEMPLATES / "qwen3.jinja").read_text()
    body = {"messages": ASK, "chat_template_kwargs": {"add_generation_prompt": False}}
    with pytest.raises(ValueError, match=r"chat_template_kwargs\.add_generation_prompt"):
        render_chat(template, json.dumps(body))


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_deepseek_v31s_thinking_switch_opens_or_closes_the_reasoning(enable_thinking: bool) -> None:
    rendered, expected = _both("deepseek-v3.1", HISTORY, [WEATHER], enable_thinking=enable_thinking)
    assert rendered == expected
    assert rendered.endswith("<｜Assistant｜><think>" if enable_thinking else "<｜Assistant｜></think>")


def test_parallel_sectioned_calls_render_their_ids_and_arguments_text_as_transformers_renders_them() -> None:
    calls = [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "functions.get_time:1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]  # fmt: skip
    messages = [
        *ASK,
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "functions.get_time:1", "content": "noon"},
    ]
    second_call = {
        "kimi-k2-thinking": "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "deepseek-v3.1": "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    }
    for family, written in second_call.items():
        rendered, expected = _both(family, messages, [WEATHER, TIME])
        assert rendered == expected, family
        assert '{"city":"Paris"}' in rendered and written in rendered, family


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
