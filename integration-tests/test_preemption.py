"""When the KV cache runs out, requests are preempted and recomputed without changing their output."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reference import Reference
from tandem_harness import TandemServer

MAX_NEW_TOKENS = 40
PROMPTS = [
    f"Chapter {i}. The storm had raged for three days when the old lighthouse keeper, tired and soaked, "
    f"finally heard a knock on the heavy wooden door. He set down his lantern, wiped his hands on his coat, "
    f"and slowly walked across the cold stone floor. When he opened the door,"
    for i in range(1, 11)
]


def test_overcommitted_kv_cache_preempts_and_every_request_keeps_its_alone_output(
    tiny_kv_tandem: TandemServer, reference: Reference
) -> None:
    info = tiny_kv_tandem.info()
    block_size = info["block_size"]
    blocks_per_request = -(-(len(reference.encode(PROMPTS[0])) + MAX_NEW_TOKENS) // block_size)
    assert blocks_per_request * len(PROMPTS) > 2 * info["kv_cache_blocks"], info
    preemptions_before = tiny_kv_tandem.metric("tandem_preemptions_total")
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: tiny_kv_tandem.generate_ids(prompt, MAX_NEW_TOKENS), PROMPTS))
    assert tiny_kv_tandem.metric("tandem_preemptions_total") > preemptions_before
    for prompt, ids in zip(PROMPTS, together, strict=True):
        alone = tiny_kv_tandem.generate_ids(prompt, MAX_NEW_TOKENS)
        reference.assert_same_greedy(prompt, alone, ids)
    assert tiny_kv_tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=5) == 0
