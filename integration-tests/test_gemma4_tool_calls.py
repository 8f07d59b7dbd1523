"""Gemma 4's tool calls through the real stack: a random-weight Qwen2 given Gemma 4's published chat template and a
tokenizer holding its markers as special tokens. The router picks the `gemma4` call syntax and reasoning format from
the template, the grammar asks for the marker and quote tokens, the detokenizer keeps them as text for the parser, and
every sampled call is a declared function whose arguments, rewritten from Gemma's value syntax into JSON, are valid
under its schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tandem_harness import TandemServer
from tool_call_cases import (
    assert_declared_and_valid,
    assert_sampled_required_calls_are_declared_and_valid,
    assert_streamed_calls_match,
    complete,
    random_model_with_markers,
    serve_with_template,
    transformers_prompt_tokens,
)

GEMMA4_TEMPLATE = Path(__file__).parents[1] / "router/python/tests/chat_templates/gemma-4.jinja"
MARKERS = [
    "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
    "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|think|>",
]  # fmt: skip


@pytest.fixture(scope="module")
def gemma4_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Qwen2 speaking the embedded model's tokenizer with Gemma 4's markers added."""
    return random_model_with_markers(tmp_path_factory.mktemp("qwen2-gemma4"), MARKERS)


@pytest.fixture(scope="module")
def gemma4(gemma4_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from serve_with_template(tmp_path_factory.mktemp("gemma4"), gemma4_model, GEMMA4_TEMPLATE)


def test_the_template_picks_the_gemma4_formats_and_renders_the_prompt_as_transformers(
    gemma4: TandemServer, gemma4_model: Path
) -> None:
    log = gemma4.log_path.read_text()
    assert "tool calls use the gemma4 syntax" in log
    assert "Gemma4" in log
    expected = transformers_prompt_tokens(gemma4_model, GEMMA4_TEMPLATE.read_text())
    assert complete(gemma4, 0)["usage"]["prompt_tokens"] == expected


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(gemma4: TandemServer) -> None:
    assert_sampled_required_calls_are_declared_and_valid(gemma4)


def test_a_streamed_call_rebuilds_the_same_calls_as_the_whole_answer(gemma4: TandemServer) -> None:
    assert_streamed_calls_match(gemma4, 7)


def test_a_call_follows_bounded_reasoning_in_the_thought_channel_when_thinking_is_switched_on(
    gemma4: TandemServer,
) -> None:
    for seed in range(3):
        completion = complete(
            gemma4, seed, max_tokens=400, reasoning_effort="minimal", chat_template_kwargs={"enable_thinking": True}
        )
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert isinstance(choice["message"].get("reasoning_content"), str)
        assert "<|tool_call>" not in choice["message"]["reasoning_content"]
        assert_declared_and_valid(choice["message"]["tool_calls"])
