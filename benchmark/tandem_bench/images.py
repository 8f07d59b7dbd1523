"""The requests of `tandem-bench images`: chat messages that each carry one PNG drawn in-process, sent as an OpenAI
`image_url` part with a base64 `data:` URL, in two modes.

fresh: every request carries an image no other request of the run carries, so the server encodes every image and its
prefix cache can reuse at most the text before the image. pooled: requests cycle through a few images the server saw
before measuring, so a server that caches image encodings and prefixes reuses both. Request i of either mode sends the
same text (one shared preamble before the image, question i after it): the modes differ only in the image.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from tandem_bench.datasets import random_text

IMAGE_KINDS = ("noise", "solid")
FRESH, POOLED = "fresh", "pooled"
MODES = (FRESH, POOLED)
# Each set of images draws from its own stream of the seed, so no image of one set repeats one of another.
WARMUP_STREAM, POOL_STREAM, FRESH_STREAM = 0, 1, 2
STREAM_STRIDE = 1 << 20
# Odd, so multiplying by it permutes the 2**24 RGB colours: distinct image numbers give distinct solid colours.
COLOUR_STEP = 0x9E3779
COLOURS = 1 << 24
PRIMING_QUESTION_SEED = -1


@dataclass(frozen=True)
class ImageWorkload:
    """`requests` chat requests per mode, each with one `width` x `height` image (`kind`: random pixels or one solid
    colour) between a shared preamble of `preamble_words` and a question of `question_words`, asking for
    `output_len` tokens; the pooled mode cycles through `pool_size` images."""

    requests: int = 40
    pool_size: int = 4
    width: int = 336
    height: int = 336
    kind: str = "noise"
    preamble_words: int = 32
    question_words: int = 8
    output_len: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in IMAGE_KINDS:
            raise ValueError(f"image kind must be one of {IMAGE_KINDS}, got {self.kind!r}")
        if min(self.requests, self.pool_size, self.width, self.height) < 1:
            raise ValueError("requests, pool size, width and height must be at least 1")
        if self.seed < 0:
            raise ValueError(f"the seed must not be negative, got {self.seed}")
        if max(self.requests, self.pool_size) >= STREAM_STRIDE:
            raise ValueError(f"at most {STREAM_STRIDE - 1} images per set")


def png_image(width: int, height: int, kind: str, seed: int, number: int) -> bytes:
    """PNG bytes of image `number` under `seed`: random pixels drawn from both, or a solid colour that no other number
    below 2**24 gets under the same seed."""
    if kind == "noise":
        pixels = np.random.default_rng([seed, number]).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        image = Image.fromarray(pixels, "RGB")
    else:
        colour = (number * COLOUR_STEP + random.Random(seed).randrange(COLOURS)) % COLOURS
        image = Image.new("RGB", (width, height), (colour >> 16, (colour >> 8) & 0xFF, colour & 0xFF))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def image_urls(workload: ImageWorkload, stream: int, count: int) -> list[str]:
    """Data URLs of the first `count` images of `stream`: none repeats an image of another stream, and random pixels
    drawn under another seed differ too."""
    first = stream * STREAM_STRIDE
    return [
        data_url(png_image(workload.width, workload.height, workload.kind, workload.seed, first + index))
        for index in range(count)
    ]


def image_messages(preamble: str, url: str, question: str) -> list[dict[str, Any]]:
    """One user message: the preamble, the image, then the question, as OpenAI chat content parts."""
    content = [
        {"type": "text", "text": preamble},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": question},
    ]
    return [{"role": "user", "content": content}]


def preamble(workload: ImageWorkload) -> str:
    text = random_text(random.Random(workload.seed), workload.preamble_words)
    return f"Look at the picture below. {text}"


def question(workload: ImageWorkload, index: int) -> str:
    """Request `index`'s question, the same in both modes."""
    return random_text(random.Random(f"{workload.seed}-{index}"), workload.question_words)


def build_requests(workload: ImageWorkload, mode: str) -> list[list[dict[str, Any]]]:
    """The messages of every request of `mode`, in sending order."""
    if mode == FRESH:
        urls = image_urls(workload, FRESH_STREAM, workload.requests)
    elif mode == POOLED:
        pool = image_urls(workload, POOL_STREAM, workload.pool_size)
        urls = [pool[index % len(pool)] for index in range(workload.requests)]
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    text = preamble(workload)
    return [image_messages(text, url, question(workload, index)) for index, url in enumerate(urls)]


def warmup_requests(workload: ImageWorkload, count: int) -> list[list[dict[str, Any]]]:
    """`count` requests with images of their own, so start-up costs land in neither mode."""
    text = preamble(workload)
    urls = image_urls(workload, WARMUP_STREAM, count)
    return [image_messages(text, url, question(workload, PRIMING_QUESTION_SEED)) for url in urls]


def priming_requests(workload: ImageWorkload) -> list[list[dict[str, Any]]]:
    """One request per pool image, so every measured pooled request finds its image seen before; their question is
    none of the measured ones, so the prefix reused is the preamble and the image, never a whole prompt."""
    text = preamble(workload)
    urls = image_urls(workload, POOL_STREAM, workload.pool_size)
    return [image_messages(text, url, question(workload, PRIMING_QUESTION_SEED)) for url in urls]


def split_rounds(requests: list[list[dict[str, Any]]], rounds: int) -> list[list[list[dict[str, Any]]]]:
    """The requests in `rounds` consecutive slices of near-equal size (the first ones one longer)."""
    size, extra = divmod(len(requests), rounds)
    slices = []
    start = 0
    for index in range(rounds):
        end = start + size + (1 if index < extra else 0)
        slices.append(requests[start:end])
        start = end
    return slices
