"""KV-cache events through the real stack: a pyzmq subscriber rebuilds the router's cached blocks from them.

The events follow vLLM's published format (msgpack `KVEventBatch`, multipart `[topic, sequence, payload]` on a
ZMQ PUB socket, a ROUTER socket for replay); block hashes follow vLLM's `sha256_cbor` algorithm, recomputed here
with cbor2 and hashlib from the prompts' token ids (docs/scaling.md).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cbor2
import msgpack
import pytest
import requests
import zmq
from tandem_harness import TandemServer, free_port, model_cache_dir

TOPIC = b"kv@tandem-0@smollm2"
HASH_SEED = "42"
BLOCK_SIZE = 16
QUIET_S = 1.5
SHARED_PREFIX = (
    "A field guide to the birds of the northern lakes, chapter one. The loon dives for fish and can stay under "
    "water for a minute. The heron stands still in the shallows and waits. The kingfisher watches from a branch "
    "above the water and drops like a stone. Question about one of these birds: "
)
QUESTIONS = ["How long can the loon stay under?", "Where does the heron wait?", "What does the kingfisher do?"]


@dataclass(frozen=True)
class EventsTandem:
    server: TandemServer
    events_endpoint: str
    replay_endpoint: str


@pytest.fixture(scope="module")
def events_tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventsTandem]:
    events_endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = TandemServer.start(
        tmp_path_factory.mktemp("kv-events") / "launcher.log",
        "--model-cache-dir", str(model_cache_dir()),
        "--kv-cache-memory", "64MiB",
        "--block-size", str(BLOCK_SIZE),
        "--kv-events-endpoint", events_endpoint,
        "--kv-events-replay-endpoint", replay_endpoint,
        "--kv-events-topic", TOPIC.decode(),
        "--kv-events-hash-seed", HASH_SEED,
    )  # fmt: skip
    yield EventsTandem(server, events_endpoint, replay_endpoint)
    assert server.stop() == 0, server.log_tail()


def vllm_block_hashes(token_ids: list[int], seed: str) -> list[int]:
    """vLLM's `sha256_cbor` chain over the whole blocks of `token_ids`, as the 64-bit integers its events carry."""
    parent = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    hashes = []
    for start in range(0, len(token_ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = tuple(token_ids[start : start + BLOCK_SIZE])
        parent = hashlib.sha256(cbor2.dumps((parent, block, None), canonical=True)).digest()
        hashes.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return hashes


def receive_until_quiet(subscriber: zmq.Socket) -> list[tuple[int, bytes]]:
    """(sequence, payload) of every message until none arrives for QUIET_S."""
    received = []
    while subscriber.poll(int(QUIET_S * 1000)):
        topic, sequence, payload = subscriber.recv_multipart()
        assert topic == TOPIC
        received.append((int.from_bytes(sequence, "big"), payload))
    return received


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Batches the replay socket sends from sequence `start` on, up to its end marker."""
    with zmq.Context.instance().socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        while True:
            assert dealer.poll(10_000), "the replay never ended"
            delimiter, sequence, payload = dealer.recv_multipart()
            assert delimiter == b""
            if int.from_bytes(sequence, "big", signed=True) == -1:
                assert payload == b""
                return batches
            batches.append((int.from_bytes(sequence, "big"), payload))


def tokenize(base_url: str, text: str) -> list[int]:
    tokens = requests.post(f"{base_url}/tokenize", json={"inputs": text}, timeout=30).json()
    return [token["id"] for token in tokens]


def generate(base_url: str, prompt: str) -> None:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 4}}
    assert requests.post(f"{base_url}/generate", json=body, timeout=300).status_code == 200


def rebuild_cached_blocks(payloads: list[bytes]) -> set[int]:
    """Stored minus removed block hashes; every stored chain must hang under a block held at that moment."""
    held: set[int] = set()
    for payload in payloads:
        ts, events, data_parallel_rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and ts > 0 and data_parallel_rank == 0
        for event in events:
            if event[0] == "BlockStored":
                _, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = event
                assert parent is None or parent in held, "a stored block's parent is not cached"
                assert (block_size, len(token_ids), lora_id, medium, lora_name) == (
                    BLOCK_SIZE, BLOCK_SIZE * len(hashes), None, "GPU", None,
                )  # fmt: skip
                held.update(hashes)
            elif event[0] == "BlockRemoved":
                _, hashes, medium = event
                assert medium == "GPU" and set(hashes) <= held
                held.difference_update(hashes)
            else:
                assert event == ["AllBlocksCleared"]
                held.clear()
    return held


def test_a_subscriber_rebuilds_the_cached_blocks_and_replay_returns_the_same_batches(
    events_tandem: EventsTandem,
) -> None:
    base_url = events_tandem.server.base_url
    with zmq.Context.instance().socket(zmq.SUB) as subscriber:
        subscriber.connect(events_tandem.events_endpoint)
        subscriber.subscribe(TOPIC)
        time.sleep(0.5)  # a PUB socket sends only to subscriptions it already knows
        generate(base_url, SHARED_PREFIX + QUESTIONS[0])
        with ThreadPoolExecutor(max_workers=len(QUESTIONS)) as pool:
            list(pool.map(lambda question: generate(base_url, SHARED_PREFIX + question), QUESTIONS))
        received = receive_until_quiet(subscriber)

    sequences = [sequence for sequence, _ in received]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences))), "a batch was lost"
    replayed = replay(events_tandem.replay_endpoint, 0)
    assert replayed[-len(received) :] == received
    assert [sequence for sequence, _ in replayed] == list(range(len(replayed)))
    assert replay(events_tandem.replay_endpoint, sequences[-1]) == received[-1:]

    held = rebuild_cached_blocks([payload for _, payload in replayed])
    assert events_tandem.server.wait_for_metric("tandem_prefix_cache_blocks", len(held), timeout=5) == len(held)
    for question in QUESTIONS:
        prompt_hashes = vllm_block_hashes(tokenize(base_url, SHARED_PREFIX + question), HASH_SEED)
        assert len(prompt_hashes) >= 4
        assert set(prompt_hashes) <= held, "a prompt block the router cached is missing from the events"
