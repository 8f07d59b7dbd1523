"""A tiny Mixtral GGUF (`llama` with experts: Q4_0 expert stacks, Q8_0 other layers) through the real launcher with
the CPU defaults: the launcher converts the file, the shard serves the expert stacks from their blocks as int4 and
says so in /info, and greedy tokens equal transformers' on the values the file dequantizes to, departing only where
transformers' two likeliest tokens nearly tie."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from near_ties import NEAR_TIE
from reference import Reference
from tandem_harness import TandemServer
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server" / "tests"))

from moe_gguf_testing import MIXTRAL, tiny_moe, write_moe_gguf

MAX_NEW_TOKENS = 8
# ASCII text: the file's vocabulary is one token per byte.
PROMPTS = ("The capital of France is", "def add(a, b):", "Once upon a time")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The GGUF file, and a transformers checkpoint of the values its tensors dequantize to with its tokenizer."""
    root = tmp_path_factory.mktemp("mixtral-gguf")
    gguf_path = root / "tiny-mixtral.gguf"
    dequantized = write_moe_gguf(gguf_path, tiny_moe(MIXTRAL, seed=7), MIXTRAL, ("Q4_0", "Q8_0"))
    dequantized.save_pretrained(root / "reference")
    AutoTokenizer.from_pretrained(root, gguf_file=gguf_path.name).save_pretrained(root / "reference")
    return {"gguf": gguf_path, "reference": root / "reference", "cache": root / "cache"}


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[TandemServer]:
    server = TandemServer.start(
        files["cache"].parent / "launcher.log",
        "--model-id", str(files["gguf"]),
        "--model-cache-dir", str(files["cache"]),
        "--max-input-tokens", "64",
        "--max-total-tokens", "96",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def test_info_reports_the_experts_served_from_their_q4_0_blocks(server: TandemServer) -> None:
    weights_format = server.info()["model_weights_format"]
    assert "experts: Q4_0 as int4" in weights_format, weights_format
    assert "experts: float" not in weights_format, weights_format


def test_greedy_tokens_equal_transformers_on_the_dequantized_values(
    server: TandemServer, files: dict[str, Path]
) -> None:
    reference = Reference(files["reference"])
    for prompt in PROMPTS:
        expected = reference.greedy(prompt, MAX_NEW_TOKENS)
        _assert_follows_up_to_near_ties(reference, prompt, expected, server.generate_ids(prompt, MAX_NEW_TOKENS))


@torch.inference_mode()
def _assert_follows_up_to_near_ties(reference: Reference, prompt: str, expected: list[int], actual: list[int]) -> None:
    """`actual` equals `expected`, or first departs from it for a token whose logit was within `NEAR_TIE` of the
    reference's choice (the int4 kernels take and give bfloat16)."""
    departs = next((i for i, (want, got) in enumerate(zip(expected, actual, strict=False)) if want != got), None)
    if departs is None:
        assert actual == expected, f"lengths differ for {prompt!r}: {actual} vs {expected}"
        return
    logits = reference.model(torch.tensor([reference.encode(prompt) + expected[:departs]])).logits[0, -1]
    gap = float(logits.max() - logits[actual[departs]])
    assert gap < NEAR_TIE, f"{prompt!r} departs at {departs} by {gap:.3f}: expected {expected}, actual {actual}"
