"""What serves beside the model in a ModelRunner, each optional."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_server.engine.draft_model import DraftModel
from tandem_server.structured import GrammarCompiler
from tandem_server.vision.embedder import ImageEmbedder


@dataclass(frozen=True)
class Companions:
    """The grammar compiler of constrained requests, the draft model of speculative decoding, and the image
    embedder of a vision-language model's images; None: the runner serves no such requests."""

    grammar_compiler: GrammarCompiler | None = None
    draft_model: DraftModel | None = None
    images: ImageEmbedder | None = None
