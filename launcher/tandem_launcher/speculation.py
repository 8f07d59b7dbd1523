"""Speculative decoding flags: `--speculate`, `--speculative-method`, and the JSON form `--speculative-config`."""

from __future__ import annotations

import json
from typing import Any

from tandem_launcher.flags import FlagAdder

SPECULATIVE_METHODS = ("ngram", "radix")
DEFAULT_METHOD = "ngram"
# The keys of vLLM's `--speculative-config` that mean the same here.
_CONFIG_KEYS = ("method", "num_speculative_tokens")


def add_speculation_flags(add: FlagAdder) -> None:
    add.value(
        "--speculate",
        int,
        0,
        "speculative decoding: draft tokens per decode step, kept only where they equal the model's own tokens; 0: off",
    )
    add.value(
        "--speculative-method",
        str,
        DEFAULT_METHOD,
        "where drafts come from: ngram (the request's own text) or radix (what an earlier request generated after "
        "the same context, from the prefix cache; ngram where it holds none)",
        choices=SPECULATIVE_METHODS,
    )
    add.value(
        "--speculative-config",
        str,
        None,
        'the two flags above as JSON, as vLLM takes them: {"method": "ngram"|"radix", "num_speculative_tokens": N}',
    )


def apply_speculative_config(values: dict[str, Any]) -> None:
    """Replaces `speculative_config` in parsed flag `values` by the `speculate` and `speculative_method` it sets.

    Raises ValueError naming the problem: malformed JSON, an unknown key or method, a bad token count, or the JSON
    form given together with `--speculate`/`--speculative-method`.
    """
    text = values.pop("speculative_config")
    if text is None:
        return
    if values["speculate"] != 0 or values["speculative_method"] != DEFAULT_METHOD:
        raise ValueError("give either --speculative-config or --speculate/--speculative-method, not both")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--speculative-config is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError("--speculative-config must be a JSON object")
    unknown = sorted(set(parsed) - set(_CONFIG_KEYS))
    if unknown:
        supported = ", ".join(_CONFIG_KEYS)
        raise ValueError(f"--speculative-config: unsupported key(s) {', '.join(unknown)}; use {supported}")
    method = parsed.get("method", DEFAULT_METHOD)
    if method not in SPECULATIVE_METHODS:
        methods = ", ".join(SPECULATIVE_METHODS)
        raise ValueError(f"--speculative-config: method must be one of {methods}, got {method!r}")
    tokens = parsed.get("num_speculative_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"--speculative-config: num_speculative_tokens must be a positive integer, got {tokens!r}")
    values["speculate"] = tokens
    values["speculative_method"] = method


def speculation_problems(speculate: int, method: str, prefix_caching: bool) -> list[str]:
    """What is wrong with a checked config's speculative decoding settings."""
    if speculate and method == "radix" and not prefix_caching:
        return ["--speculative-method radix drafts from the prefix cache: it needs --prefix-caching true"]
    return []
