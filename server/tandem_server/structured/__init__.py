"""Grammar-constrained decoding with llguidance: per-request matchers, masks applied per step."""

from tandem_server.structured.compiler import GrammarCompiler
from tandem_server.structured.grammar import GrammarKind, GrammarSpec
from tandem_server.structured.mask import grammar_token_mask
from tandem_server.structured.matcher import GrammarMatcher

__all__ = ["GrammarCompiler", "GrammarKind", "GrammarMatcher", "GrammarSpec", "grammar_token_mask"]
