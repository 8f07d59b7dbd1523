"""Speculative decoding with a draft model (`--speculative-model`) on the real stack: the launcher resolves it, every
shard loads it beside the model and proposes drafts from it, the router counts them under `method="draft"`. Here the
embedded model drafts for itself, the one model sharing its tokenizer on this machine, so its greedy drafts are
kept: greedy tokens still match transformers and seeded tokens match the server without speculation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from reference import Reference
from speculation import ACCEPTED, DRAFTED
from tandem_harness import (
    FLOAT32_EAGER,
    MAX_INPUT_TOKENS,
    MAX_TOTAL_TOKENS,
    TandemServer,
    embedded_model_dir,
    model_cache_dir,
)
from test_speculative_decoding import sampled_ids

T = TypeVar("T")
PROMPT = "Write a short story about a beekeeper negotiating with a storm.\n"


@pytest.fixture(scope="module")
def drafting(tmp_path_factory: pytest.TempPathFactory, reference: Reference) -> Iterator[TandemServer]:
    # `reference` exists once the embedded model is converted, so its directory can be given as the draft model.
    log_path = tmp_path_factory.mktemp("draft-model") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-cache-dir", str(model_cache_dir()), *FLOAT32_EAGER,
        "--kv-cache-memory", "256MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--speculate", "3",
        "--speculative-model", str(embedded_model_dir()),
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def draft_counts(server: TandemServer, generate: Callable[[], T]) -> tuple[T, float, float]:
    """What `generate` returns, and the draft-model drafts proposed and kept meanwhile."""
    drafted, kept = server.metric(DRAFTED, method="draft"), server.metric(ACCEPTED, method="draft")
    result = generate()
    return result, server.metric(DRAFTED, method="draft") - drafted, server.metric(ACCEPTED, method="draft") - kept


def test_info_names_the_draft_model_every_shard_loaded(drafting: TandemServer) -> None:
    info = drafting.info()
    assert info["speculative_method"] == "draft"
    assert info["speculative_model"] == "LlamaForCausalLM, 30 layers"


def test_greedy_tokens_match_transformers_and_the_draft_models_drafts_are_kept(
    drafting: TandemServer, reference: Reference
) -> None:
    expected = reference.greedy(PROMPT, 24)
    actual, drafted, kept = draft_counts(drafting, lambda: drafting.generate_ids(PROMPT, 24))
    reference.assert_same_greedy(PROMPT, expected, actual)
    print(f"\nkept {kept:.0f} of {drafted:.0f} draft-model drafts")
    # The same weights draft greedily: only a near-tie computed in another batch shape can differ.
    assert drafted > 0 and 0.8 * drafted <= kept <= drafted


def test_seeded_tokens_are_those_of_the_server_without_speculation(
    drafting: TandemServer, tandem: TandemServer
) -> None:
    for seed in (3, 11):
        drafted_ids, drafted, _ = draft_counts(drafting, lambda seed=seed: sampled_ids(drafting, PROMPT, seed))
        assert drafted > 0
        assert drafted_ids == sampled_ids(tandem, PROMPT, seed)
