"""Recently encoded images' embeddings by digest, so a repeated image skips the encoder."""

from __future__ import annotations

from collections import OrderedDict

import torch

# `--encoder-cache-memory`'s default: room for about 50 images of a 7B LLaVA (576 tokens x 4096 x bfloat16 each).
DEFAULT_ENCODER_CACHE_BYTES = 256 * 1024**2


class EncoderCache:
    """An LRU map from an image's SHA-256 digest to its embeddings, holding at most `max_bytes` of them: adding one
    evicts the least recently used until it fits, and embeddings larger than the whole budget are never kept."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"the encoder cache's budget must not be negative, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of embeddings held now."""
        return self._bytes

    def get(self, digest: bytes) -> torch.Tensor | None:
        """The embeddings of the image `digest` names, now the most recently used; None when not held."""
        embeddings = self._entries.get(digest)
        if embeddings is not None:
            self._entries.move_to_end(digest)
        return embeddings

    def put(self, digest: bytes, embeddings: torch.Tensor) -> None:
        """Holds `embeddings` under `digest`, evicting the least recently used entries to stay within budget."""
        size = embeddings.numel() * embeddings.element_size()
        if size > self.max_bytes:
            return
        previous = self._entries.pop(digest, None)
        if previous is not None:
            self._bytes -= previous.numel() * previous.element_size()
        while self._entries and self._bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.numel() * evicted.element_size()
        self._entries[digest] = embeddings
        self._bytes += size
