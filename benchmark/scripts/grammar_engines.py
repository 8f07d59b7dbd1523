"""Per-step cost of llguidance and xgrammar on one tokenizer: compile time and mask + apply + advance per token.

Run: uv run --no-sync --with xgrammar --with transformers python benchmark/scripts/grammar_engines.py TOKENIZER_DIR
Each engine drives the same seeded random logits through a constrained generation of up to 100 tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llguidance
import llguidance.torch as lltorch
import torch
import xgrammar
from transformers import PreTrainedTokenizerFast

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
REGEX = r"(\+[0-9]{1,3} )?[0-9]{3}-[0-9]{3}-[0-9]{4}( ext\. [0-9]{1,5})?( \([a-z ]{1,60}\))?"
MAX_TOKENS = 100
# Seconds per phase of every step, reset per grammar: mask computation, mask applied to logits, advance.
PHASES: dict[str, list[float]] = {"mask": [], "apply": [], "advance": []}


def timed(phase: str, action: Callable[[], object]) -> object:
    start = time.perf_counter()
    result = action()
    PHASES[phase].append(time.perf_counter() - start)
    return result


RUNS = 5


def drive(step: Callable[[torch.Tensor], int | None], vocab: int, seed: int) -> tuple[int, float]:
    """Feeds seeded random logits to `step` until it stops; returns (tokens, seconds in step)."""
    generator = torch.Generator().manual_seed(seed)
    spent = 0.0
    for n in range(MAX_TOKENS):
        logits = torch.randn(1, vocab, generator=generator)
        start = time.perf_counter()
        token = step(logits)
        spent += time.perf_counter() - start
        if token is None:
            return n, spent
    return MAX_TOKENS, spent


def bench_llguidance(tokenizer_json: Path, eos: int, grammars: dict[str, str]) -> dict[str, dict[str, float]]:
    tokenizer = llguidance.LLTokenizer(str(tokenizer_json), eos_token=eos)
    vocab = tokenizer.vocab_size
    results = {}
    for kind, grammar in grammars.items():
        compile_s, per_token, counts = [], [], []
        for seconds in PHASES.values():
            seconds.clear()
        for run in range(RUNS):
            start = time.perf_counter()
            matcher = llguidance.LLMatcher(tokenizer, grammar)
            compile_s.append(time.perf_counter() - start)
            assert not matcher.is_error(), matcher.get_error()
            bitmask = lltorch.allocate_token_bitmask(1, vocab)

            def step(logits: torch.Tensor, matcher=matcher, bitmask=bitmask) -> int | None:
                if matcher.is_stopped():
                    return None
                timed("mask", lambda: lltorch.fill_next_token_bitmask(matcher, bitmask, 0))
                timed("apply", lambda: lltorch.apply_token_bitmask_inplace(logits, bitmask))
                token = int(logits.argmax(dim=-1))
                if token == eos:
                    return None
                assert timed("advance", lambda: matcher.consume_token(token))
                return token

            tokens, spent = drive(step, vocab, run)
            per_token.append(spent / max(tokens, 1))
            counts.append(tokens)
        results[kind] = {
            "compile_ms": round(1000 * statistics.median(compile_s), 2),
            "step_mean_us": round(1e6 * statistics.fmean(per_token), 1),
            **{f"{phase}_mean_us": round(1e6 * statistics.fmean(s), 1) for phase, s in PHASES.items()},
            "mask_max_us": round(1e6 * max(PHASES["mask"]), 1),
            "tokens_per_run": counts,
        }
    return results


def bench_xgrammar(tokenizer_dir: Path, eos: int, sources: dict[str, str]) -> dict[str, dict[str, float]]:
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[eos])
    vocab = info.vocab_size
    results = {}
    for kind, source in sources.items():
        compile_s, per_token, counts = [], [], []
        for seconds in PHASES.values():
            seconds.clear()
        for run in range(RUNS):
            compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
            start = time.perf_counter()
            compiled = compiler.compile_json_schema(source) if kind == "json_schema" else compiler.compile_regex(source)
            compile_s.append(time.perf_counter() - start)
            matcher = xgrammar.GrammarMatcher(compiled)
            bitmask = xgrammar.allocate_token_bitmask(1, vocab)

            def step(logits: torch.Tensor, matcher=matcher, bitmask=bitmask) -> int | None:
                if matcher.is_terminated():
                    return None
                timed("mask", lambda: matcher.fill_next_token_bitmask(bitmask, 0))
                timed("apply", lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask))
                token = int(logits.argmax(dim=-1))
                if token == eos:
                    return None
                assert timed("advance", lambda: matcher.accept_token(token))
                return token

            tokens, spent = drive(step, vocab, run)
            per_token.append(spent / max(tokens, 1))
            counts.append(tokens)
        results[kind] = {
            "compile_ms": round(1000 * statistics.median(compile_s), 2),
            "step_mean_us": round(1e6 * statistics.fmean(per_token), 1),
            **{f"{phase}_mean_us": round(1e6 * statistics.fmean(s), 1) for phase, s in PHASES.items()},
            "mask_max_us": round(1e6 * max(PHASES["mask"]), 1),
            "tokens_per_run": counts,
        }
    return results


def main() -> None:
    tokenizer_dir = Path(sys.argv[1])
    eos = json.loads((tokenizer_dir / "generation_config.json").read_text())["eos_token_id"]
    torch.set_num_threads(1)
    ll = bench_llguidance(
        tokenizer_dir / "tokenizer.json",
        eos,
        {
            "json_schema": llguidance.LLMatcher.grammar_from_json_schema(SCHEMA),
            "regex": llguidance.LLMatcher.grammar_from_regex(REGEX),
        },
    )
    xg = bench_xgrammar(tokenizer_dir, eos, {"json_schema": json.dumps(SCHEMA), "regex": REGEX})
    print(json.dumps({"llguidance": ll, "xgrammar": xg}, indent=2))


if __name__ == "__main__":
    main()
