"""Prefix caching on a hybrid (a small random Qwen3.5: Gated DeltaNet layers beside attention) through the real
launcher: a five-turn conversation re-sends its whole history each turn and, from turn 2 on, resumes after at least
80 % of it from state checkpoints; its tokens equal those of a server with prefix caching off; a second conversation
that shares only the system prompt resumes inside it, from a checkpoint an earlier prompt saved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from recurrent_models import serving_flags, write_random_hybrid
from reference import Reference
from tandem_harness import TandemServer

TURNS = 5
NEW_TOKENS = 8
BLOCK_SIZE = 16
CHECKPOINT_INTERVAL = 64
MAX_TOTAL_TOKENS = 1024
SYSTEM = "You are the keeper of a lighthouse log. " + " ".join(
    f"Rule {rule}: write the wind, the tide and every ship you see, then sign the entry." for rule in range(1, 9)
)
QUESTIONS = ("What did you see at dawn?", "And the tide?", "Any ships?", "Who signed it?", "Anything else?")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = write_random_hybrid("qwen3_5", tmp_path_factory.mktemp("qwen3_5"))
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = MAX_TOTAL_TOKENS
    config_path.write_text(json.dumps(config))
    return model_dir


def start(model_dir: Path, log_dir: Path, *flags: str) -> TandemServer:
    return TandemServer.start(
        log_dir / "launcher.log",
        *serving_flags(model_dir),
        "--max-input-tokens", str(MAX_TOTAL_TOKENS - NEW_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--block-size", str(BLOCK_SIZE),
        *flags,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cached(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    server = start(
        model_dir, tmp_path_factory.mktemp("cached"), "--state-checkpoint-interval", str(CHECKPOINT_INTERVAL)
    )
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def uncached(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    server = start(model_dir, tmp_path_factory.mktemp("uncached"), "--prefix-caching", "false")
    yield server
    assert server.stop() == 0, server.log_tail()


def complete(server: TandemServer, prompt: list[int]) -> str:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def converse(server: TandemServer, reference: Reference, system: str) -> tuple[list[str], list[float], list[int]]:
    """Five turns, each re-sending the whole history as token ids: the answers, the tokens each turn resumed after
    (prefix-cache hits), and how many history tokens each turn re-sent."""
    history = reference.encode(system)
    answers, reused, resent = [], [], []
    for question in QUESTIONS[:TURNS]:
        resent.append(len(history))
        history = history + reference.encode(f"\nUser: {question}\nKeeper:")
        hits_before = server.metric("tandem_prefix_cache_hits_tokens_total")
        answer = complete(server, history)
        reused.append(server.metric("tandem_prefix_cache_hits_tokens_total") - hits_before)
        answers.append(answer)
        history = history + reference.encode(answer)
    return answers, reused, resent


def test_each_turn_resumes_after_most_of_its_history_with_the_uncached_servers_tokens(
    cached: TandemServer, uncached: TandemServer, model_dir: Path
) -> None:
    reference = Reference(model_dir)
    answers, reused, resent = converse(cached, reference, SYSTEM)
    # Turn 1 re-sends nothing; from turn 2 the previous prompt and answer come back, less at most one block.
    for turn in range(1, TURNS):
        assert reused[turn] >= 0.8 * resent[turn], (turn, reused, resent)
        assert reused[turn] % BLOCK_SIZE == 0
    assert uncached.info()["prefix_caching"] is False
    assert converse(uncached, reference, SYSTEM)[0] == answers
    assert cached.wait_for_metric("tandem_running_requests", 0, timeout=30) == 0


def test_a_conversation_sharing_only_the_system_prompt_resumes_inside_it(cached: TandemServer, model_dir: Path) -> None:
    reference = Reference(model_dir)
    system_tokens = len(reference.encode(SYSTEM))
    assert system_tokens > CHECKPOINT_INTERVAL
    complete(cached, reference.encode(SYSTEM + "\nUser: How tall is the tower?\nKeeper:"))
    hits_before = cached.metric("tandem_prefix_cache_hits_tokens_total")
    complete(cached, reference.encode(SYSTEM + "\nUser: Which lamp oil do you burn?\nKeeper:"))
    reused = cached.metric("tandem_prefix_cache_hits_tokens_total") - hits_before
    # The first request's prompt saved a checkpoint every CHECKPOINT_INTERVAL tokens of the system prompt.
    assert reused >= system_tokens // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL, (reused, system_tokens)
