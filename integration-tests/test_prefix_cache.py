"""The radix prefix cache through the real stack: a repeated prefix is reused and changes no output."""

from __future__ import annotations

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
