# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars by design)
"""DeepSeek-V3.1's tool calls through the real stack: a random-weight Qwen2 given DeepSeek-V3.1's chat template and a
tokenizer holding its markers as special tokens. The router picks the `deepseek_v31` syntax and the `deepseek_v3`
reasoning format from the template, the grammar asks for the marker tokens, the detokenizer keeps them as text for the
parser, and every sampled call is a declared function with arguments valid under its schema."""

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

DEEPSEEK_TEMPLATE = Path(__file__).parents[1] / "router/python/tests/chat_templates/deepseek-v3.1.jinja"
MARKERS = [
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
    "<｜User｜>", "<｜Assistant｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<think>", "</think>",
]  # fmt: skip


@pytest.fixture(scope="module")
def deepseek_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Qwen2 speaking the embedded model's tokenizer with DeepSeek-V3.1's markers added."""
    return random_model_with_markers(tmp_path_factory.mktemp("qwen2-deepseek-v31"), MARKERS)


@pytest.fixture(scope="module")
def deepseek(deepseek_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from serve_with_template(tmp_path_factory.mktemp("deepseek-v31"), deepseek_model, DEEPSEEK_TEMPLATE)


def test_the_template_picks_the_deepseek_formats_and_renders_the_prompt_as_transformers(
    deepseek: TandemServer, deepseek_model: Path
) -> None:
    log = deepseek.log_path.read_text()
    assert "tool calls use the deepseek_v31 syntax" in log
    assert "DeepseekV3" in log
    expected = transformers_prompt_tokens(deepseek_model, DEEPSEEK_TEMPLATE.read_text())
    assert complete(deepseek, 0)["usage"]["prompt_tokens"] == expected


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(
    deepseek: TandemServer,
) -> None:
    assert_sampled_required_calls_are_declared_and_valid(deepseek)


def test_a_streamed_call_rebuilds_the_same_calls_as_the_whole_answer(deepseek: TandemServer) -> None:
    assert_streamed_calls_match(deepseek, 7)


def test_a_call_follows_bounded_reasoning_when_thinking_is_switched_on(deepseek: TandemServer) -> None:
    for seed in range(3):
        completion = complete(
            deepseek, seed, max_tokens=400, reasoning_effort="minimal", chat_template_kwargs={"enable_thinking": True}
        )
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert isinstance(choice["message"].get("reasoning_content"), str)
        assert "<｜tool" not in choice["message"]["reasoning_content"]
        assert_declared_and_valid(choice["message"]["tool_calls"])
