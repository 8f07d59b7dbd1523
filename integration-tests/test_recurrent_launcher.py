"""Small random hybrids through the real launcher: Qwen3.5 (Gated DeltaNet layers beside gated attention), Qwen3-Next
(the same with experts), Granite 4.0-H (Mamba-2 layers beside attention without rotary, Granite's multipliers, routed
experts beside the shared MLP) and Nemotron-H (Mamba-2, attention and relu² MLP blocks per
`hybrid_override_pattern`): greedy tokens equal transformers' for prompts run alone and together, one prompt longer
than a prefill chunk and the recurrent layers' chunks, prefilled over two steps; a repeated prompt resumes from a
state checkpoint with the same tokens, and no request is left running once they are done."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from recurrent_models import LONG_PROMPT, PREFILL_CHUNK, PROMPTS, serving_flags, write_random_hybrid
from reference import Reference
from tandem_harness import TandemServer

MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module", params=["granite-hybrid", "nemotron-h", "qwen3_5", "qwen3_next"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random checkpoint of each family, speaking the embedded model's tokenizer."""
    return write_random_hybrid(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp(f"{model_dir.name}-serve") / "launcher.log"
    server = TandemServer.start(log_path, *serving_flags(model_dir))
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Reference:
    return Reference(model_dir)


def test_greedy_tokens_equal_transformers_alone_and_together(server: TandemServer, reference: Reference) -> None:
    assert len(reference.encode(LONG_PROMPT)) > PREFILL_CHUNK
    expected = [reference.greedy(prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
    for prompt, want in zip(PROMPTS, expected, strict=True):
        reference.assert_same_greedy(prompt, want, server.generate_ids(prompt, MAX_NEW_TOKENS))
    # Together: short requests decode while the long prompt is prefilled in chunks.
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: server.generate_ids(prompt, MAX_NEW_TOKENS), PROMPTS))
    for prompt, want, got in zip(PROMPTS, expected, together, strict=True):
        reference.assert_same_greedy(prompt, want, got)
    assert server.wait_for_metric("tandem_running_requests", 0, timeout=30) == 0


def test_a_repeated_prompt_resumes_from_a_state_checkpoint_with_the_same_tokens(server: TandemServer) -> None:
    info = server.info()
    assert (info["prefix_caching"], info["model_recurrent_state"]) == (True, True), info
    assert info["state_checkpoints"] > 0 and info["state_checkpoint_bytes"] > 0, info
    hits_before = server.metric("tandem_prefix_cache_hits_tokens_total")
    cold = server.generate_ids(LONG_PROMPT, MAX_NEW_TOKENS)
    assert server.generate_ids(LONG_PROMPT, MAX_NEW_TOKENS) == cold
    assert server.metric("tandem_prefix_cache_hits_tokens_total") > hits_before
