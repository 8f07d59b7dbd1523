"""The grammar a request's output must match, as the router sent it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import llguidance


class GrammarKind(Enum):
    """The source language of a grammar (the contract's `Grammar.kind`)."""

    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    LARK = "lark"


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar's kind and source text; compiled into a matcher per request."""

    kind: GrammarKind
    source: str

    def to_llguidance(self) -> str:
        """The llguidance grammar document for this source (validity is checked when a matcher is built)."""
        if self.kind is GrammarKind.JSON_SCHEMA:
            return llguidance.LLMatcher.grammar_from_json_schema(self.source)
        if self.kind is GrammarKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        return llguidance.LLMatcher.grammar_from_lark(self.source)
