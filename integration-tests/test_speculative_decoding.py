"""Speculative decoding (`--speculate 4`) on the real stack: drafts from the request's own text are kept by the shard
where they equal its own draws, so greedy tokens match transformers and seeded tokens match the server without
speculation, while kept drafts show in the metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from reference import Reference
from tandem_harness import MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, TandemServer, model_cache_dir

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, polished the great "
    "lens and watched the ships pass the rocks below."
)
# Input-grounded prompts: the answer repeats text the prompt holds, which prompt lookup drafts.
GROUNDED = (
    f"Copy this sentence exactly.\nSentence: {PASSAGE}\nCopy: {PASSAGE}\nCopy again:",
    "<|im_start|>user\nRepeat after me: one two three four five six seven eight nine ten.<|im_end|>\n"
    "<|im_start|>assistant\n",
)
ACCEPTED = "tandem_speculative_accepted_tokens_total"
DRAFTED = "tandem_speculative_draft_tokens_total"


@pytest.fixture(scope="module")
def speculating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("speculating") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-cache-dir", str(model_cache_dir()),
        "--kv-cache-memory", "256MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--speculate", "4",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def sampled_ids(server: TandemServer, prompt: str, seed: int) -> list[int]:
    parameters = {"max_new_tokens": 32, "do_sample": True, "temperature": 0.8, "seed": seed, "details": True}
    response = requests.post(
        f"{server.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=300
    )
    assert response.status_code == 200, response.text
    return [token["id"] for token in response.json()["details"]["tokens"]]


def test_greedy_tokens_match_transformers_and_drafts_are_kept(speculating: TandemServer, reference: Reference) -> None:
    assert speculating.info()["speculate"] == 4
    before = {name: speculating.metric(name) for name in (ACCEPTED, DRAFTED)}
    for prompt in GROUNDED:
        expected = reference.greedy(prompt, 40)
        reference.assert_same_greedy(prompt, expected, speculating.generate_ids(prompt, 40))
    accepted = speculating.metric(ACCEPTED) - before[ACCEPTED]
    drafted = speculating.metric(DRAFTED) - before[DRAFTED]
    print(f"\nkept {accepted:.0f} of {drafted:.0f} drafts")
    assert 0 < accepted <= drafted


def test_seeded_tokens_are_those_of_the_server_without_speculation(
    speculating: TandemServer, tandem: TandemServer
) -> None:
    for seed, prompt in enumerate(GROUNDED, start=3):
        assert sampled_ids(speculating, prompt, seed) == sampled_ids(tandem, prompt, seed)
