# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars by design)
"""DeepSeek-V3.2's DSML tool calls through the real stack: a random-weight Qwen2 given a chat template that writes
DSML (V3.2 publishes a Python encoder rather than a template, so the test writes a small one in its shape). The
router picks the `deepseek_v32` syntax from the template, and every sampled call is a declared function whose
parameters, each tagged raw or JSON by its schema, read back into arguments valid under that schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tandem_harness import TandemServer
from tool_call_cases import (
    assert_sampled_required_calls_are_declared_and_valid,
    assert_streamed_calls_match,
    complete,
    random_model_with_markers,
    serve_with_template,
    transformers_prompt_tokens,
)

MARKERS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]
# The encoder's shape: the tool schemas as JSON in the system text, past calls as a DSML block. No blank lines:
# transformers and the tokenizers library split this vocabulary's "\n\n" differently.
DSML_TEMPLATE = """
{%- if tools -%}
{{- '## Tools\\nInvoke functions in a <｜DSML｜function_calls> block.\\n### Available Tool Schemas\\n' -}}
{%- for tool in tools -%}{{- tool.function | tojson -}}{{- '\\n' -}}{%- endfor -%}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}{{- '<｜User｜>' + message.content -}}
{%- elif message.role == 'assistant' -%}{{- '<｜Assistant｜></think>' + (message.content or '') -}}
{%- if message.tool_calls -%}{{- '\\n<｜DSML｜function_calls>\\n' -}}
{%- for call in message.tool_calls -%}{{- '<｜DSML｜invoke name="' + call.function.name + '">\\n' -}}
{%- for key in call.function.arguments -%}{%- set value = call.function.arguments[key] -%}
{{- '<｜DSML｜parameter name="' + key + '" string="' + ('true' if value is string else 'false') + '">' -}}
{{- value if value is string else value | tojson -}}{{- '</｜DSML｜parameter>\\n' -}}
{%- endfor -%}{{- '</｜DSML｜invoke>\\n' -}}{%- endfor -%}{{- '</｜DSML｜function_calls>' -}}
{%- endif -%}
{%- elif message.role == 'tool' -%}
{{- '<function_results>\\n<result>' + message.content + '</result>\\n</function_results>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜></think>' -}}{%- endif -%}"""


@pytest.fixture(scope="module")
def dsml_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Qwen2 speaking the embedded model's tokenizer with DeepSeek's turn markers added."""
    model_dir = random_model_with_markers(tmp_path_factory.mktemp("qwen2-deepseek-v32"), MARKERS)
    (model_dir / "dsml.jinja").write_text(DSML_TEMPLATE)
    return model_dir


@pytest.fixture(scope="module")
def dsml(dsml_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from serve_with_template(
        tmp_path_factory.mktemp("deepseek-v32"),
        dsml_model,
        dsml_model / "dsml.jinja",
        "--reasoning-parser",
        "deepseek_v3",
    )


def test_the_template_picks_the_dsml_syntax_and_renders_the_prompt_as_transformers(
    dsml: TandemServer, dsml_model: Path
) -> None:
    assert "tool calls use the deepseek_v32 syntax" in dsml.log_path.read_text()
    expected = transformers_prompt_tokens(dsml_model, DSML_TEMPLATE)
    assert complete(dsml, 0)["usage"]["prompt_tokens"] == expected


def test_every_sampled_required_call_is_a_declared_function_with_schema_valid_arguments(dsml: TandemServer) -> None:
    assert_sampled_required_calls_are_declared_and_valid(dsml)


def test_a_streamed_call_rebuilds_the_same_calls_as_the_whole_answer(dsml: TandemServer) -> None:
    assert_streamed_calls_match(dsml, 7)
