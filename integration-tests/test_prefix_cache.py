"""The radix prefix cache through the real stack: a repeated prefix is reused and changes no output."""

from __future__ import annotations

import requests
from tandem_harness import TandemServer

SHARED_PREFIX = (
    "The town library keeps a notebook of facts for its visitors. It opens at nine on weekdays and at ten on "
    "Saturdays. Books may be borrowed for three weeks and renewed twice. The reading room on the first floor is "
    "quiet, the children's corner is on the ground floor, and the local history archive is in the basement. "
    "Late books cost ten cents a day. Here is one more fact from the notebook: "
)


def test_a_shared_prefix_is_served_from_the_cache_with_identical_tokens(tandem: TandemServer) -> None:
    queries_before = tandem.metric("tandem_prefix_cache_queries_tokens_total")
    hits_before = tandem.metric("tandem_prefix_cache_hits_tokens_total")
    cold = tandem.generate_ids(SHARED_PREFIX + "On Sundays the library", max_new_tokens=12)
    hits_after_cold = tandem.metric("tandem_prefix_cache_hits_tokens_total")
    warm = tandem.generate_ids(SHARED_PREFIX + "On Sundays the library", max_new_tokens=12)
    hits_after_warm = tandem.metric("tandem_prefix_cache_hits_tokens_total")
    tandem.generate_ids(SHARED_PREFIX + "The oldest book in the archive", max_new_tokens=12)
    hits_after_other = tandem.metric("tandem_prefix_cache_hits_tokens_total")

    assert warm == cold, "a prefix-cache hit changed the greedy output"
    # The shared prefix is ~80 tokens: whole 16-token blocks of it are reused by both later requests.
    assert hits_after_warm - hits_after_cold >= 64
    assert hits_after_other - hits_after_warm >= 64
    assert hits_after_cold >= hits_before
    assert tandem.metric("tandem_prefix_cache_queries_tokens_total") > queries_before
    assert len(cold) == 12, "the continuation stopped early, so it shows little"
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=5) == 0
    # Idle, yet the prefix stays cached for the next request (until its blocks are needed).
    assert tandem.metric("tandem_prefix_cache_blocks") >= 4


def test_usage_reports_the_prompt_tokens_the_cache_served_on_each_surface(tandem: TandemServer) -> None:
    # A first sentence no other request sends: the first request finds nothing cached.
    prompt = "A visitor from the coast asked the librarian a question. " + SHARED_PREFIX + "On weekdays the archive"
    completion = {"model": "tandem", "prompt": prompt, "max_tokens": 4}
    cold = requests.post(f"{tandem.base_url}/v1/completions", json=completion, timeout=120).json()["usage"]
    warm = requests.post(f"{tandem.base_url}/v1/completions", json=completion, timeout=120).json()["usage"]
    prompt_tokens = warm["prompt_tokens"]
    # Whole 16-token blocks of the ~85-token prompt come from the cache the second time, and never the last token.
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert 64 <= warm["prompt_tokens_details"]["cached_tokens"] < prompt_tokens
    assert warm["prompt_tokens_details"]["cached_tokens"] % 16 == 0
    chat = {"model": "tandem", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    for _ in range(2):
        chat_usage = requests.post(f"{tandem.base_url}/v1/chat/completions", json=chat, timeout=120).json()["usage"]
    assert chat_usage["prompt_tokens_details"]["cached_tokens"] >= 64
    message = {"model": "tandem", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    anthropic = requests.post(f"{tandem.base_url}/v1/messages", json=message, timeout=120).json()["usage"]
    assert anthropic["cache_read_input_tokens"] >= 64
    assert anthropic["cache_creation_input_tokens"] == 0
    counting = {"model": "tandem", "messages": message["messages"]}
    counted = requests.post(f"{tandem.base_url}/v1/messages/count_tokens", json=counting, timeout=30).json()
    assert anthropic["input_tokens"] + anthropic["cache_read_input_tokens"] == counted["input_tokens"]
