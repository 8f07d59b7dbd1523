"""Speculative decoding (`--speculate 4 --speculative-method radix`) on the real stack: drafts from the request's own
text, or from what an earlier request generated after the same context, are kept by the shard where they equal its
own draws, so greedy tokens match transformers and seeded tokens match the server without speculation, while kept
drafts show in the metrics. A request's `speculate` caps its drafts: 0 drafts nothing and
changes no token, and a cap above the server's is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import requests
from reference import Reference
from speculation import ACCEPTED, DRAFTED, GROUNDED, REPEAT
from tandem_harness import FLOAT32_EAGER, MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, TandemServer, model_cache_dir

T = TypeVar("T")

# What a request leaves behind once it is done: none of them may move for good after a refused one.
IDLE_GAUGES = ("tandem_kv_blocks_used", "tandem_kv_cache_usage_ratio", "tandem_running_requests", "tandem_queue_size")


@pytest.fixture(scope="module")
def speculating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("speculating") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-cache-dir", str(model_cache_dir()), *FLOAT32_EAGER,
        "--kv-cache-memory", "256MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--speculate", "4",
        "--speculative-method", "radix",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def generated_ids(server: TandemServer, prompt: str, **parameters: object) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 32, "details": True, **parameters}}
    response = requests.post(f"{server.base_url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return [token["id"] for token in response.json()["details"]["tokens"]]


def sampled_ids(server: TandemServer, prompt: str, seed: int, **parameters: object) -> list[int]:
    return generated_ids(server, prompt, do_sample=True, temperature=0.8, seed=seed, **parameters)


def chat_text(server: TandemServer, **fields: object) -> str:
    body = {"model": "tandem", "messages": [{"role": "user", "content": REPEAT}], "max_tokens": 32, "temperature": 0}
    response = requests.post(f"{server.base_url}/v1/chat/completions", json={**body, **fields}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def drafts_while(server: TandemServer, generate: Callable[[], T]) -> tuple[T, float]:
    """What `generate` returns and the draft tokens the router proposed meanwhile."""
    before = server.metric(DRAFTED)
    result = generate()
    return result, server.metric(DRAFTED) - before


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


def test_speculate_0_on_generate_drafts_nothing_and_changes_no_token(speculating: TandemServer) -> None:
    prompt = GROUNDED[0]
    drafting, drafted = drafts_while(speculating, lambda: generated_ids(speculating, prompt))
    assert drafted > 0, "the uncapped request proposed no draft, so the cap below would prove nothing"
    capped, drafted = drafts_while(speculating, lambda: generated_ids(speculating, prompt, speculate=0))
    assert drafted == 0
    assert capped == drafting


def test_speculate_0_on_chat_completions_drafts_nothing_and_changes_no_token(speculating: TandemServer) -> None:
    drafting, drafted = drafts_while(speculating, lambda: chat_text(speculating))
    assert drafted > 0, "the uncapped request proposed no draft, so the cap below would prove nothing"
    capped, drafted = drafts_while(speculating, lambda: chat_text(speculating, speculate=0))
    assert drafted == 0
    assert capped == drafting


def test_seeded_tokens_are_the_same_with_speculate_0_and_with_drafts(speculating: TandemServer) -> None:
    """On one server, unlike the test against the server without speculation, and the drafts are seen proposed."""
    prompt = GROUNDED[0]
    drafting, drafted = drafts_while(speculating, lambda: sampled_ids(speculating, prompt, 7))
    assert drafted > 0, "the uncapped request proposed no draft, so the cap below would prove nothing"
    capped, drafted = drafts_while(speculating, lambda: sampled_ids(speculating, prompt, 7, speculate=0))
    assert drafted == 0
    assert capped == drafting


def test_speculate_above_the_servers_is_refused_naming_it_and_leaves_nothing_behind(speculating: TandemServer) -> None:
    idle = {name: speculating.metric(name) for name in IDLE_GAUGES}
    refused_before = speculating.metric("tandem_request_failure_total", reason="validation")
    drafted_before = speculating.metric(DRAFTED)
    native = requests.post(
        f"{speculating.base_url}/generate", json={"inputs": REPEAT, "parameters": {"speculate": 5}}, timeout=30
    )
    assert 400 <= native.status_code < 500, native.text
    assert "`speculate` must be an integer from 0 to 4, got 5" in native.json()["error"], native.text
    chat = requests.post(
        f"{speculating.base_url}/v1/chat/completions",
        json={"model": "tandem", "messages": [{"role": "user", "content": REPEAT}], "speculate": 5},
        timeout=30,
    )
    assert 400 <= chat.status_code < 500, chat.text
    error = chat.json()["error"]
    assert error["param"] == "speculate" and "from 0 to 4, got 5" in error["message"], chat.text
    assert speculating.metric("tandem_request_failure_total", reason="validation") == refused_before + 2
    assert speculating.metric(DRAFTED) == drafted_before
    assert speculating.generate_ids(REPEAT, 4)
    for name, value in idle.items():
        assert speculating.wait_for_metric(name, value, timeout=10) == value, name


def test_a_repeated_request_is_drafted_from_what_the_first_one_generated(speculating: TandemServer) -> None:
    assert speculating.info()["speculative_method"] == "radix"
    # Free text no other test asks: only the first answer, cached in the radix tree, predicts the second.
    prompt = "Write a short story about a violin that remembers every player.\n"
    first, first_radix = drafts_from_cache(speculating, lambda: generated_ids(speculating, prompt))
    second, second_radix = drafts_from_cache(speculating, lambda: generated_ids(speculating, prompt))
    assert second == first
    assert first_radix == (0.0, 0.0), "nothing was generated after this context before"
    # The cache holds the first answer's full 16-token blocks: the tokens up to the end of the last one can be drafted.
    drafted, kept = second_radix
    assert drafted == kept >= 8, f"{kept} of {drafted} radix drafts kept for {len(second)} tokens"


def drafts_from_cache(server: TandemServer, generate: Callable[[], T]) -> tuple[T, tuple[float, float]]:
    """What `generate` returns, and the radix drafts proposed and kept meanwhile."""
    before = (server.metric(DRAFTED, method="radix"), server.metric(ACCEPTED, method="radix"))
    result = generate()
    after = (server.metric(DRAFTED, method="radix"), server.metric(ACCEPTED, method="radix"))
    return result, (after[0] - before[0], after[1] - before[1])
