"""Test helpers for grammars: a tiny random Llama with the embedded model's vocabulary and tokenizer, so grammars
compile over real token strings."""

from __future__ import annotations

import shutil
from pathlib import Path

from shard_testing import write_tiny_llama
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
from tandem_server.structured import GrammarCompiler

# The embedded model's vocabulary and end-of-sequence token.
VOCAB_SIZE = 49152
EOS = 2


def write_grammar_checkpoint(path: Path) -> Path:
    """A tiny random Llama in `path` with the embedded model's tokenizer.json; returns `path`."""
    write_tiny_llama(path, vocab_size=VOCAB_SIZE)
    embedded = converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)
    shutil.copy(embedded / "tokenizer.json", path / "tokenizer.json")
    return path


def grammar_compiler(checkpoint: Path) -> GrammarCompiler:
    compiler = GrammarCompiler.from_model_dir(checkpoint, VOCAB_SIZE, [EOS])
    assert compiler is not None
    return compiler
