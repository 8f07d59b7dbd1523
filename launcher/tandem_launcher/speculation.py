"""Speculative decoding flags: `--speculate`, `--speculative-method`, the draft model `--speculative-model`, and the
JSON form `--speculative-config`."""

from __future__ import annotations

import json
from typing import Any

from tandem_launcher.flags import FlagAdder

SPECULATIVE_METHODS = ("ngram", "radix", "draft")
DEFAULT_METHOD = "ngram"
# The method that drafts with `--speculative-model`, and vLLM's name for it in `--speculative-config`.
DRAFT_METHOD = "draft"
_CONFIG_METHODS = {**{method: method for method in SPECULATIVE_METHODS}, "draft_model": DRAFT_METHOD}
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
# The keys of vLLM's `--speculative-config` that mean the same here, and the flags they set.
_CONFIG_KEYS = {
    "method": "speculative_method",
    "num_speculative_tokens": "speculate",
    "disable_by_batch_size": "speculative_disable_by_batch_size",
    "model": "speculative_model",
    "revision": "speculative_model_revision",
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
        None,
        "where drafts come from: ngram (the request's own text), radix (what an earlier request generated after "
        "the same context, from the prefix cache; ngram where it holds none) or draft (the --speculative-model, run "
        "on every shard); none: draft when --speculative-model is given, else ngram",
        choices=SPECULATIVE_METHODS,
    )
    add.value(
        "--speculative-disable-by-batch-size",
        int,
        DEFAULT_DISABLE_BY_BATCH_SIZE,
        "no step carries drafts while more requests than this run (a large batch keeps the shards busy already)",
    )
    add.value(
        "--speculative-model",
        str,
        None,
        "the draft model of --speculative-method draft, given as --model-id is (a local directory, a .gguf file or "
        "a Hugging Face repo id, downloaded before any shard starts); it must use the served model's tokenizer",
    )
    add.value("--speculative-model-revision", str, None, "revision of a --speculative-model repo id; none: main")
    add.value(
        "--speculative-config",
        str,
        None,
        'the flags above as JSON, as vLLM takes them: {"method": "ngram"|"radix"|"draft_model", '
        '"num_speculative_tokens": N, "disable_by_batch_size": M, "model": DRAFT_MODEL, "revision": REVISION}',
    )


def apply_speculative_config(values: dict[str, Any]) -> None:
    """Replaces `speculative_config` in parsed flag `values` by the speculation flags it sets.

    Raises ValueError naming the problem: malformed JSON, an unknown key or method, a bad count or model name, or the
    JSON form given together with the flags it stands for.
    """
    text = values.pop("speculative_config")
    if text is None:
        return
    defaults = {
        "speculate": 0,
        "speculative_method": None,
        "speculative_disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE,
        "speculative_model": None,
        "speculative_model_revision": None,
    }
    if any(values[name] != default for name, default in defaults.items()):
        raise ValueError("give either --speculative-config or the --speculate/--speculative-* flags, not both")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--speculative-config is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError("--speculative-config must be a JSON object")
    _check_config_values(parsed)
    for key, value in parsed.items():
        values[_CONFIG_KEYS[key]] = _CONFIG_METHODS[value] if key == "method" else value


def _check_config_values(parsed: dict[str, Any]) -> None:
    """Raises ValueError naming the first unknown key or bad value of a parsed `--speculative-config`."""
    unknown = sorted(set(parsed) - set(_CONFIG_KEYS))
    if unknown:
        supported = ", ".join(_CONFIG_KEYS)
        raise ValueError(f"--speculative-config: unsupported key(s) {', '.join(unknown)}; use {supported}")
    if "method" in parsed and (not isinstance(parsed["method"], str) or parsed["method"] not in _CONFIG_METHODS):
        methods = ", ".join(_CONFIG_METHODS)
        raise ValueError(f"--speculative-config: method must be one of {methods}, got {parsed['method']!r}")
    if "num_speculative_tokens" not in parsed:
        raise ValueError("--speculative-config: num_speculative_tokens is required")
    for key in parsed.keys() & {"num_speculative_tokens", "disable_by_batch_size"}:
        count = parsed[key]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"--speculative-config: {key} must be a positive integer, got {count!r}")
    for key in parsed.keys() & {"model", "revision"}:
        if not isinstance(parsed[key], str) or not parsed[key]:
            raise ValueError(f"--speculative-config: {key} must be a non-empty string, got {parsed[key]!r}")


def choose_speculative_method(method: str | None, speculative_model: str | None) -> str:
    """The method given, else draft when a draft model is given, else ngram."""
    if method is not None:
        return method
    return DRAFT_METHOD if speculative_model is not None else DEFAULT_METHOD


def speculation_problems(
    speculate: int, method: str, disable_by_batch_size: int, prefix_caching: bool, speculative_model: str | None
) -> list[str]:
    """What is wrong with a config's speculative decoding settings (`--speculate` is checked with the counts)."""
    problems = []
    if disable_by_batch_size < 1:
        problems.append(f"--speculative-disable-by-batch-size must be positive, got {disable_by_batch_size}")
    if speculate and method == "radix" and not prefix_caching:
        problems.append("--speculative-method radix drafts from the prefix cache: it needs --prefix-caching true")
    if method == DRAFT_METHOD and speculative_model is None:
        problems.append("--speculative-method draft drafts with a draft model: it needs --speculative-model")
    if speculative_model is not None and method != DRAFT_METHOD:
        problems.append(
            f"--speculative-model is the draft model of --speculative-method draft; --speculative-method {method} "
            "does not use it"
        )
    if speculative_model is not None and speculate == 0:
        problems.append("--speculative-model drafts only with --speculate N > 0 (draft tokens per decode step)")
    return problems
