"""Builds matchers over the model's tokenizer; the tokenizer is loaded once at start-up."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import llguidance

from tandem_server.errors import FailureKind, RequestFailedError
from tandem_server.structured.grammar import GrammarSpec
from tandem_server.structured.matcher import GrammarMatcher

logger = logging.getLogger(__name__)

# Distinct grammars kept compiled; `n`/`best_of` siblings and a preempted request's replay reuse their grammar's.
COMPILED_GRAMMARS = 64
# llguidance's own bounds on the work of one grammar (compile fuel, per-token mask fuel); its error messages then
# name the limit without dumping parser state.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)
_MAX_ERROR_CHARS = 200


class GrammarCompiler:
    """Owns the llguidance tokenizer; the shard reads nothing textual besides `tokenizer.json`."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        # Width of the logits; token ids the tokenizer lacks (padding) are never allowed.
        self.vocab_size = vocab_size
        # Freshly compiled matchers that consumed nothing, least recently used first; only ever deep-copied.
        self._compiled: OrderedDict[GrammarSpec, llguidance.LLMatcher] = OrderedDict()

    @classmethod
    def from_model_dir(cls, model_path: Path, vocab_size: int, eos_token_ids: Sequence[int]) -> GrammarCompiler | None:
        """The compiler for `model_path/tokenizer.json`, or None when the model ships none llguidance can read."""
        tokenizer_json = model_path / "tokenizer.json"
        if not tokenizer_json.is_file():
            return None
        try:
            tokenizer = llguidance.LLTokenizer(str(tokenizer_json), n_vocab=vocab_size, eos_token=list(eos_token_ids))
        except (ValueError, RuntimeError) as error:
            # The router disables grammars for the same vocabulary, so no constrained request arrives.
            logger.warning("grammar-constrained decoding is disabled: %s", error)
            return None
        return cls(tokenizer, vocab_size)

    def matcher(self, spec: GrammarSpec, generated: Sequence[int] = ()) -> GrammarMatcher:
        """A fresh matcher for `spec` that has already consumed `generated` (replay after recompute)."""
        wrapped = GrammarMatcher(self._compile(spec).deep_copy(), self.vocab_size)
        for token_id in generated:
            wrapped.advance(token_id)
        return wrapped

    def _compile(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        try:
            source = spec.to_llguidance()
        except (ValueError, RuntimeError) as error:
            raise _compile_failure(spec, str(error)) from None
        compiled = llguidance.LLMatcher(self.tokenizer, source, log_level=0, limits=_LIMITS)
        if compiled.is_error():
            raise _compile_failure(spec, compiled.get_error())
        self._compiled[spec] = compiled
        if len(self._compiled) > COMPILED_GRAMMARS:
            self._compiled.popitem(last=False)
        return compiled


def _compile_failure(spec: GrammarSpec, detail: str) -> RequestFailedError:
    logger.debug("%s grammar does not compile: %s", spec.kind.value, detail)
    first_line = detail.strip().splitlines()[0] if detail.strip() else "unknown error"
    return RequestFailedError(
        FailureKind.GRAMMAR, f"the {spec.kind.value} grammar does not compile: {first_line[:_MAX_ERROR_CHARS]}"
    )
