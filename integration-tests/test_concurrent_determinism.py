"""Continuous batching and chunked prefill do not change what a greedy request generates."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reference import Reference
from tandem_harness import MAX_INPUT_TOKENS, TandemServer

STEP_BUDGET_TOKENS = 512
TOPICS = ("rivers", "volcanoes", "bread", "chess", "owls", "comets", "glass", "tea")


def long_prompt(reference: Reference) -> str:
    """A prompt longer than one step's token budget, so its prefill spans several steps."""
    sentences = [f"Fact {i}: the number {i} squared is {i * i}." for i in range(1, 200)]
    prompt = ""
    for sentence in sentences:
        prompt += sentence + " "
        if len(reference.encode(prompt)) > STEP_BUDGET_TOKENS + 150:
            break
    prompt += "In summary,"
    assert STEP_BUDGET_TOKENS < len(reference.encode(prompt)) < MAX_INPUT_TOKENS
    return prompt


def test_sixteen_concurrent_streams_equal_their_alone_outputs(tandem: TandemServer, reference: Reference) -> None:
    requests_ = [(f"Here is a short note about {TOPICS[i % 8]} number {i}:", 6 + i) for i in range(15)]
    requests_.append((long_prompt(reference), 12))
    with ThreadPoolExecutor(max_workers=len(requests_)) as pool:
        concurrent = list(pool.map(lambda item: tandem.stream_ids(*item), requests_))
    for (prompt, max_new_tokens), together in zip(requests_, concurrent, strict=True):
        alone = tandem.generate_ids(prompt, max_new_tokens)
        assert together, f"no tokens streamed for {prompt[:40]!r}"
        reference.assert_same_greedy(prompt, alone, together)


def test_prompt_longer_than_the_step_budget_matches_transformers(tandem: TandemServer, reference: Reference) -> None:
    prompt = long_prompt(reference)
    reference.assert_same_greedy(prompt, reference.greedy(prompt, 12), tandem.generate_ids(prompt, 12))
