"""A request's images: the checks on its spans, and the embeddings a step's rows take at the image positions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tandem_server.device_copy import to_device
from tandem_server.engine.grid_positions import GridPositions, ImageGrid
from tandem_server.engine.step import NewRequest, RequestFailure
from tandem_server.errors import FailureKind, ImageError, RequestFailedError
from tandem_server.execution.batch import ScheduledSpan
from tandem_server.layers.embedding import InputEmbeddings
from tandem_server.vision.embedder import ImageEmbedder

if TYPE_CHECKING:
    from tandem_server.engine.requests import RequestState

SHA256_BYTES = 32


@dataclass(frozen=True)
class ImagePiece:
    """The part of an image's embeddings a step runs: `embeddings[i]` is the input of prompt position
    `position + i` of request `request_id`, inside the image's whole span [span_start, span_end)."""

    request_id: int
    position: int
    embeddings: torch.Tensor
    span_start: int
    span_end: int


def check_images(request: NewRequest, image_token_id: int | None) -> None:
    """Refuses images a text-only model cannot read, and spans that are out of order, overlap, leave the prompt or
    hold another token than the image token."""
    images = request.images
    if not images:
        return
    if image_token_id is None:
        raise RequestFailedError(
            FailureKind.INVALID_PARAMETERS, f"this model reads text only; the request carries {len(images)} images"
        )
    prompt_len = len(request.token_ids) - request.num_output_tokens
    previous_end = 0
    for index, image in enumerate(images):
        if image.num_tokens < 1 or image.offset < previous_end or image.end > prompt_len:
            raise RequestFailedError(
                FailureKind.INVALID_PARAMETERS,
                f"image {index}: its span [{image.offset}, {image.end}) is empty, overlaps the one before it or "
                f"leaves the {prompt_len}-token prompt",
            )
        if any(token != image_token_id for token in request.token_ids[image.offset : image.end]):
            raise RequestFailedError(
                FailureKind.INVALID_PARAMETERS,
                f"image {index}: its span [{image.offset}, {image.end}) holds tokens other than the image token "
                f"{image_token_id}",
            )
        if len(image.digest) != SHA256_BYTES:
            raise RequestFailedError(FailureKind.INVALID_PARAMETERS, f"image {index}: its digest is not a SHA-256")
        previous_end = image.end


def image_grids(request: NewRequest, token_grid: Callable[[bytes], tuple[int, int]]) -> GridPositions | None:
    """The token grids of the request's images (`token_grid` reads an image file's rows and columns from its header,
    without decoding it); None for a request without images. An image whose grid holds another number of tokens than
    its span, or whose header cannot be read, fails the request."""
    if not request.images:
        return None
    grids = []
    for index, image in enumerate(request.images):
        try:
            rows, columns = token_grid(image.data)
        except ImageError as error:
            raise RequestFailedError(FailureKind.INVALID_PARAMETERS, f"image {index}: {error}") from error
        if rows * columns != image.num_tokens:
            raise RequestFailedError(
                FailureKind.INVALID_PARAMETERS,
                f"image {index} becomes {rows}x{columns} tokens, its span holds {image.num_tokens} positions",
            )
        grids.append(ImageGrid(image.offset, rows, columns))
    return GridPositions(tuple(grids))


def scheduled_pieces(
    plan: Sequence[tuple[RequestState, int]], embedder: ImageEmbedder
) -> tuple[list[ImagePiece], list[RequestFailure]]:
    """The pieces of every image span the planned chunks reach (an image is encoded whole, or found in the encoder
    cache, and sliced to the chunk); a request whose image cannot be encoded, or encodes to another number of
    embeddings than its span holds, fails alone."""
    pieces: list[ImagePiece] = []
    failures: list[RequestFailure] = []
    for state, num_tokens in plan:
        try:
            pieces.extend(_request_pieces(state, num_tokens, embedder))
        except RequestFailedError as error:
            failures.append(RequestFailure(state.id, error.kind, str(error)))
    return pieces, failures


def _request_pieces(state: RequestState, num_tokens: int, embedder: ImageEmbedder) -> list[ImagePiece]:
    # Runs before num_computed advances: the chunk is positions [num_computed, num_computed + num_tokens).
    start, stop = state.num_computed, state.num_computed + num_tokens
    pieces = []
    for index, image in enumerate(state.images):
        first, last = max(start, image.offset), min(stop, image.end)
        if first >= last:
            continue
        if embedder.bidirectional_spans and last < image.end:
            # The span's first positions would attend to later ones whose keys are not yet computed.
            raise RequestFailedError(
                FailureKind.INVALID_PARAMETERS,
                f"image {index}: the step's chunk ends at position {stop}, inside the image's span "
                f"[{image.offset}, {image.end}), whose positions attend to each other bidirectionally; a chunk must "
                "end before a span or after it",
            )
        try:
            embeddings = embedder.embeddings(image.data, image.digest)
        except ImageError as error:
            raise RequestFailedError(FailureKind.INVALID_PARAMETERS, f"image {index}: {error}") from error
        if embeddings.shape[0] != image.num_tokens:
            raise RequestFailedError(
                FailureKind.INVALID_PARAMETERS,
                f"image {index} encodes to {embeddings.shape[0]} embeddings, its span holds {image.num_tokens} "
                "positions",
            )
        piece = embeddings[first - image.offset : last - image.offset]
        pieces.append(ImagePiece(state.id, first, piece, image.offset, image.end))
    return pieces


def bidirectional_spans(pieces: Sequence[ImagePiece]) -> dict[int, tuple[tuple[int, int], ...]]:
    """By request, the whole spans of the images whose pieces a step runs."""
    spans: dict[int, tuple[tuple[int, int], ...]] = {}
    for piece in pieces:
        spans[piece.request_id] = (*spans.get(piece.request_id, ()), (piece.span_start, piece.span_end))
    return spans


def input_embeddings(
    pieces: Sequence[ImagePiece], spans: Sequence[ScheduledSpan], device: torch.device
) -> InputEmbeddings:
    """The step's rows at image positions and their embeddings, for the spans flattened in order."""
    first_rows: dict[int | None, tuple[int, int]] = {}
    row = 0
    for span in spans:
        first_rows[span.request_id] = (row, span.start_position)
        row += len(span.token_ids)
    rows: list[int] = []
    for piece in pieces:
        first_row, start_position = first_rows[piece.request_id]
        begin = first_row + piece.position - start_position
        rows.extend(range(begin, begin + piece.embeddings.shape[0]))
    values = torch.cat([piece.embeddings for piece in pieces])
    return InputEmbeddings(to_device(torch.tensor(rows, dtype=torch.long), device), values)
