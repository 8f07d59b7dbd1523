"""Builds matchers over the model's tokenizer; the tokenizer is loaded once at start-up."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import llguidance

from tandem_server.errors import InvalidStepError
from tandem_server.structured.grammar import GrammarSpec
from tandem_server.structured.matcher import GrammarMatcher

logger = logging.getLogger(__name__)


class GrammarCompiler:
    """Owns the llguidance tokenizer; the shard reads nothing textual besides `tokenizer.json`."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        # Width of the logits; token ids the tokenizer lacks (padding) are never allowed.
        self.vocab_size = vocab_size

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
        matcher = llguidance.LLMatcher(self.tokenizer, spec.to_llguidance(), log_level=0)
        if matcher.is_error():
            raise InvalidStepError(f"invalid {spec.kind.value} grammar: {matcher.get_error()}")
        wrapped = GrammarMatcher(matcher, self.vocab_size)
        for token_id in generated:
            wrapped.advance(token_id)
        return wrapped
