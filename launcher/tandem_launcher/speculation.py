"""Speculative decoding flags: `--speculate`, `--speculative-method`, and the JSON form `--speculative-config`."""

from __future__ import annotations

import json
from typing import Any

from tandem_launcher.flags import FlagAdder

SPECULATIVE_METHODS = ("ngram", "radix")
DEFAULT_METHOD = "ngram"
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
# The keys of vLLM's `--speculative-config` that mean the same here, and the flags they set.
_CONFIG_KEYS = {
    "method": "speculative_method",
    "num_speculative_tokens": "speculate",
    "disable_by_batch_size": "speculative_disable_by_batch_size",
}


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
        "--speculative-disable-by-batch-size",
        int,
        DEFAULT_DISABLE_BY_BATCH_SIZE,
        "no step carries drafts while more requests than this run (a large batch keeps the shards busy already)",
    )
    add.value(
        "--speculative-config",
        str,
        None,
        'the flags above as JSON, as vLLM takes them: {"method": "ngram"|"radix", "num_speculative_tokens": N, '
        '"disable_by_batch_size": M}',
    )


def apply_speculative_config(values: dict[str, Any]) -> None:
    """Replaces `speculative_config` in parsed flag `values` by the speculation flags it sets.

    Raises ValueError naming the problem: malformed JSON, an unknown key or method, a bad count, or the JSON form
    given together with the flags it stands for.
    """
    text = values.pop("speculative_config")
    if text is None:
        return
    defaults = {
        "speculate": 0,
        "speculative_method": DEFAULT_METHOD,
        "speculative_disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE,
    }
    if any(values[name] != default for name, default in defaults.items()):
        raise ValueError("give either --speculative-config or the --speculate/--speculative-* flags, not both")
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
    if "num_speculative_tokens" not in parsed:
        raise ValueError("--speculative-config: num_speculative_tokens is required")
    for key in parsed.keys() & {"num_speculative_tokens", "disable_by_batch_size"}:
        count = parsed[key]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"--speculative-config: {key} must be a positive integer, got {count!r}")
    for key, value in parsed.items():
        values[_CONFIG_KEYS[key]] = value


def speculation_problems(speculate: int, method: str, disable_by_batch_size: int, prefix_caching: bool) -> list[str]:
    """What is wrong with a config's speculative decoding settings (`--speculate` is checked with the counts)."""
    problems = []
    if disable_by_batch_size < 1:
        problems.append(f"--speculative-disable-by-batch-size must be positive, got {disable_by_batch_size}")
    if speculate and method == "radix" and not prefix_caching:
        problems.append("--speculative-method radix drafts from the prefix cache: it needs --prefix-caching true")
    return problems
