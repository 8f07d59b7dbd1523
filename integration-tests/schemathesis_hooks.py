"""schemathesis hooks for `test_openapi_fuzzing.py`: generation requests stay small (few new tokens, few
sequences), so a run is bounded in time on a CPU; every other generated value is left as it is."""

from __future__ import annotations

from typing import Any

import schemathesis

MAX_NEW_TOKENS = 4
MAX_SEQUENCES = 2
INT64_MAX = 2**63 - 1
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions")
NATIVE_ROUTES = ("/", "/generate", "/generate_stream")
ANTHROPIC_MESSAGES = "/v1/messages"
OPENAI_RESPONSES = "/v1/responses"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bound(fields: dict[str, Any], names: tuple[str, ...], limit: int) -> None:
    """Caps counts the schema allows; a count past int64 (negative testing) is left for the server to refuse."""
    for name in names:
        if _is_count(fields.get(name)) and limit < fields[name] <= INT64_MAX:
            fields[name] = limit


def _bound_new_tokens(fields: dict[str, Any], names: tuple[str, ...]) -> None:
    """Caps the new-token count and sets it when absent (the default is the whole context)."""
    _bound(fields, names, MAX_NEW_TOKENS)
    if all(fields.get(name) is None for name in names):
        fields[names[0]] = MAX_NEW_TOKENS


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    if not isinstance(body, dict) or context.operation is None:
        return body
    path = context.operation.path
    if path in OPENAI_ROUTES:
        _bound_new_tokens(body, ("max_tokens", "max_completion_tokens"))
        _bound(body, ("n", "best_of"), MAX_SEQUENCES)
    elif path == ANTHROPIC_MESSAGES:
        _bound_new_tokens(body, ("max_tokens",))
    elif path == OPENAI_RESPONSES:
        _bound_new_tokens(body, ("max_output_tokens",))
    elif path in NATIVE_ROUTES:
        parameters = body.setdefault("parameters", {})
        if isinstance(parameters, dict):
            _bound_new_tokens(parameters, ("max_new_tokens",))
            _bound(parameters, ("best_of",), MAX_SEQUENCES)
        elif parameters is None:
            body["parameters"] = {"max_new_tokens": MAX_NEW_TOKENS}
    return body
