"""Validates response bodies against the published OpenAI and TGI schemas (`shared/conformance`).

Without those schemas only the validation is left out (with a warning); the tests' own assertions still run."""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

REPOSITORY = Path(__file__).resolve().parents[1]


def schema_dir() -> Path | None:
    """The first `shared/conformance` beside the repository or above it."""
    for base in REPOSITORY.parents:
        candidate = base / "shared" / "conformance"
        if candidate.is_dir():
            return candidate
    return None


class SchemaValidationSkipped(UserWarning):
    """The published schemas are absent, so a body was not validated against them."""


@cache
def _definitions(document: str) -> dict[str, Any] | None:
    directory = schema_dir()
    return None if directory is None else json.loads((directory / document).read_text())


def validate(document: str, root: str, instance: Any) -> None:
    """Raises `jsonschema.ValidationError` unless `instance` is a valid `root` of `document`; warns and returns when
    `shared/conformance` is absent."""
    defs = _definitions(document)
    if defs is None:
        warnings.warn(f"shared/conformance is absent: {root} not validated", SchemaValidationSkipped, stacklevel=3)
        return
    schema = {"$schema": defs["$schema"], "$defs": defs["$defs"], "$ref": f"#/$defs/{root}"}
    jsonschema.Draft202012Validator(schema).validate(instance)


def openai(root: str, instance: Any) -> None:
    """Validates against OpenAI's schema `root` (e.g. `CreateChatCompletionResponse`)."""
    validate("openai-schemas.json", root, instance)


def tgi(root: str, instance: Any) -> None:
    """Validates against TGI's schema `root` (e.g. `GenerateResponse`)."""
    validate("tgi-schemas.json", root, instance)


def sse_events(lines: Any) -> list[str]:
    """The `data:` payloads of an SSE body given as text lines, in order."""
    return [line[len("data:") :].strip() for line in lines if line and line.startswith("data:")]


def openai_completion_chunk(chunk: dict[str, Any]) -> None:
    """Validates a streamed `/v1/completions` chunk. OpenAI's own streams send `finish_reason: null` until a
    choice ends while its schema types the field as a string, so null is checked here and the rest against
    `CreateCompletionResponse`."""
    choices = []
    for choice in chunk["choices"]:
        assert "finish_reason" in choice, choice
        choices.append({**choice, "finish_reason": choice["finish_reason"] or "stop"})
    openai("CreateCompletionResponse", {**chunk, "choices": choices})
