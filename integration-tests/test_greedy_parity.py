"""Greedy decoding through Tandem reproduces transformers on the same weights."""

from __future__ import annotations

from reference import Reference
from tandem_harness import TandemServer

MAX_NEW_TOKENS = 20
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at a temperature of",
)


def test_greedy_token_ids_match_transformers(tandem: TandemServer, reference: Reference) -> None:
    for prompt in PROMPTS:
        expected = reference.greedy(prompt, MAX_NEW_TOKENS)
        actual = tandem.generate_ids(prompt, MAX_NEW_TOKENS)
        assert actual, f"no tokens for {prompt!r}"
        reference.assert_same_greedy(prompt, expected, actual)
