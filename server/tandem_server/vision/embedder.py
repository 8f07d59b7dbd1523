"""Encoded image bytes to the text model's input embeddings: preprocessing, the vision family's encoder, and the
encoder cache in front of both."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tandem_server.errors import ImageError
from tandem_server.vision.encoder_cache import EncoderCache
from tandem_server.vision.image_encoder import ImageEncoder
from tandem_server.vision.preprocess import ImagePreprocessor, decode_image, image_dimensions


@dataclass(frozen=True)
class EncoderCounts:
    """Images encoded, images served from the encoder cache, and the seconds spent decoding, preprocessing and
    encoding (on CUDA: until the encoder's kernels are queued)."""

    runs: int = 0
    cache_hits: int = 0
    seconds: float = 0.0


class ImageEmbedder:
    """One image at a time, by digest: the cached embeddings, or those the encoder computes and the cache keeps.

    Every tensor-parallel rank holds the whole encoder and encodes the same images, so every rank writes the same
    embeddings into the same rows.
    """

    def __init__(
        self, encoder: ImageEncoder, preprocessor: ImagePreprocessor, cache: EncoderCache, device: torch.device
    ) -> None:
        self.encoder = encoder
        self.preprocessor = preprocessor
        self.cache = cache
        self.device = device
        # Replaced whole by the model thread, so a reader on another thread (the metrics endpoint) sees one snapshot.
        self._counts = EncoderCounts()

    @property
    def image_token_id(self) -> int:
        return self.encoder.image_token_id

    @property
    def bidirectional_spans(self) -> bool:
        """Whether each image span's positions attend to each other in both directions."""
        return self.encoder.bidirectional_spans

    @property
    def grid_positions(self) -> bool:
        """Whether the text decoder's rotary positions of an image span follow the image's token grid."""
        return self.encoder.grid_positions

    def token_grid(self, data: bytes) -> tuple[int, int]:
        """The rows and columns of tokens the image file `data` becomes, from its header alone (families with
        `grid_positions`); an ImageError when its header cannot be read or its size cannot be served."""
        width, height = image_dimensions(data)
        try:
            return self.encoder.token_grid(self.preprocessor.processor, width, height)
        except ValueError as error:
            raise ImageError(f"the image cannot be preprocessed ({error})") from error

    @property
    def description(self) -> str:
        return self.encoder.description

    def counts(self) -> EncoderCounts:
        """The counts so far; safe to read from any thread."""
        return self._counts

    @torch.inference_mode()
    def embeddings(self, data: bytes, digest: bytes) -> torch.Tensor:
        """The embeddings `[tokens, text hidden]` of the image file `data` whose SHA-256 is `digest`, in the model's
        dtype on its device; an ImageError when `data` cannot be decoded."""
        cached = self.cache.get(digest)
        if cached is not None:
            self._count(EncoderCounts(cache_hits=1))
            return cached
        started = time.perf_counter()
        inputs = self.preprocessor.inputs(decode_image(data))
        embeddings = self.encoder({name: value.to(self.device) for name, value in inputs.items()})
        self.cache.put(digest, embeddings)
        self._count(EncoderCounts(runs=1, seconds=time.perf_counter() - started))
        return embeddings

    def _count(self, more: EncoderCounts) -> None:
        counts = self._counts
        self._counts = EncoderCounts(
            counts.runs + more.runs, counts.cache_hits + more.cache_hits, counts.seconds + more.seconds
        )
