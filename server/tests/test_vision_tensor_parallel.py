"""LLaVA, Gemma 3 and Qwen2.5-VL under tensor parallelism: the text decoder split over two gloo ranks, the vision
tower whole on each, gives the single process's tokens and logits."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from tandem_server.distributed import ParallelContext
from tandem_server.engine.step import NewRequest
from vision_testing import (
    gemma3_prompt,
    image_file,
    image_request,
    prompt_with_images,
    qwen2_5_vl_prompt,
    write_tiny_gemma3_vision,
    write_tiny_llava,
    write_tiny_qwen2_5_vl,
)
from vision_tp_worker import WORLD_SIZE, run_rank, run_vision

# The slow tier (starts gloo process groups): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def assert_ranks_match_the_single_process(root: Path, request: NewRequest, chunk: int) -> None:
    torch.save({"request": request, "chunk": chunk}, root / "request.pt")
    single = run_vision(root / "model", request, chunk, ParallelContext())
    mp.start_processes(run_rank, args=(root, free_port()), nprocs=WORLD_SIZE, start_method="spawn")
    for rank in range(WORLD_SIZE):
        result = torch.load(root / f"rank{rank}.pt")
        assert result["tokens"] == single["tokens"]
        torch.testing.assert_close(result["logits"], single["logits"], rtol=1e-4, atol=1e-4)


def test_two_gloo_ranks_match_the_single_process_on_a_prompt_with_two_images(tmp_path: Path) -> None:
    write_tiny_llava(tmp_path / "model")
    tokens, images = prompt_with_images([[1, 12], image_file(2), [40, 9], image_file(3, (64, 48)), [71, 12]])
    # Chunks of 7 split the image spans.
    assert_ranks_match_the_single_process(tmp_path, image_request(1, tokens, images, max_new_tokens=6), chunk=7)


def test_two_gloo_ranks_serve_gemma3_s_bidirectional_image_spans_as_one_process_does(tmp_path: Path) -> None:
    write_tiny_gemma3_vision(tmp_path / "model")
    tokens, images = gemma3_prompt([[1, 12], image_file(2), [40, 9], image_file(3, (64, 48)), [71, 12]])
    # The whole prompt in one chunk, both spans in it.
    assert_ranks_match_the_single_process(tmp_path, image_request(1, tokens, images, max_new_tokens=6), chunk=64)


def test_two_gloo_ranks_serve_qwen2_5_vl_s_grid_positions_as_one_process_does(tmp_path: Path) -> None:
    write_tiny_qwen2_5_vl(tmp_path / "model")
    parts: list[list[int] | bytes] = [[1, 12], image_file(2, (40, 24)), [40, 9], image_file(3, (90, 70)), [71, 12]]
    tokens, images = qwen2_5_vl_prompt(tmp_path / "model", parts)
    # Chunks of 7 start and end inside the image spans.
    assert_ranks_match_the_single_process(tmp_path, image_request(1, tokens, images, max_new_tokens=6), chunk=7)
