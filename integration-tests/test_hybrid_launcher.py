"""A small random LFM2 (gated short convolutions beside attention layers), dense and as LFM2-MoE (a dense first layer,
then experts behind the biased sigmoid router), through the real launcher: greedy tokens
equal transformers' for prompts of several lengths (one longer than a prefill chunk) run alone and together; prefix
reuse is off, so a repeated prompt hits no cache and gives the same tokens; preemption under a tiny KV budget and
cancelled streams change no request's tokens and leave no state slot held."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from reference import Reference
from tandem_harness import FLOAT32_EAGER, TandemServer, embedded_model_dir
from transformers import Lfm2Config, Lfm2ForCausalLM, Lfm2MoeConfig, Lfm2MoeForCausalLM, PreTrainedModel

MAX_NEW_TOKENS = 12
# Attention on one layer in three: the others keep only a convolution state, no KV blocks.
LAYER_TYPES = ["conv", "full_attention", "conv"]
HIDDEN, KV_HEADS, HEAD_DIM = 64, 2, 16
FLOAT32_BYTES = 4
# Ten blocks of 16 tokens: the preemption test's requests need three blocks each.
KV_CACHE_BLOCKS = 10
MAX_TOTAL_TOKENS = 128
# Prompts longer than this take more than one step to prefill.
PREFILL_CHUNK = 16
# Four requests run at once, so four state slots serve every request.
MAX_BATCH_SIZE = 4
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "The town library opens at nine on weekdays and at ten on Saturdays. Books may be borrowed for three weeks",
)


def attention_bytes_per_token() -> int:
    return 2 * LAYER_TYPES.count("full_attention") * KV_HEADS * HEAD_DIM * FLOAT32_BYTES


def lfm2(settings: dict[str, object]) -> PreTrainedModel:
    return Lfm2ForCausalLM(Lfm2Config(**settings, block_multiple_of=16))


def lfm2_moe(settings: dict[str, object]) -> PreTrainedModel:
    config = Lfm2MoeConfig(
        **settings, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    )
    model = Lfm2MoeForCausalLM(config)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            # Both start at zero, which would tie every expert.
            if name.endswith(("feed_forward.gate.weight", "expert_bias")):
                tensor.copy_(torch.randn_like(tensor))
    return model


FAMILIES = {"lfm2": lfm2, "lfm2-moe": lfm2_moe}
# Greedy parity and prefix reuse run on both families; preemption and cancellation, which the experts do not change,
# on LFM2 alone.
BOTH_FAMILIES = pytest.mark.parametrize("lfm2_dir", sorted(FAMILIES), indirect=True)
DENSE_ONLY = pytest.mark.parametrize("lfm2_dir", ["lfm2"], indirect=True)


@pytest.fixture(scope="module")
def lfm2_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random checkpoint of each family, speaking the embedded model's tokenizer."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp(request.param)
    embedded_config = json.loads((embedded / "config.json").read_text())
    torch.manual_seed(0)
    settings: dict[str, object] = {
        "vocab_size": embedded_config["vocab_size"],
        "bos_token_id": embedded_config["bos_token_id"],
        "eos_token_id": embedded_config["eos_token_id"],
        "pad_token_id": 0,
        "hidden_size": HIDDEN,
        "intermediate_size": 96,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": LAYER_TYPES,
        "num_attention_heads": HIDDEN // HEAD_DIM,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_TOTAL_TOKENS,
        "initializer_range": 0.2,
        "tie_word_embeddings": True,
    }
    FAMILIES[request.param](settings).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


@pytest.fixture(scope="module")
def server(lfm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    kv_cache_bytes = (KV_CACHE_BLOCKS + 1) * 16 * attention_bytes_per_token()
    server = TandemServer.start(
        tmp_path_factory.mktemp(f"{lfm2_dir.name}-serve") / "launcher.log",
        "--model-id", str(lfm2_dir), *FLOAT32_EAGER,
        "--kv-cache-memory", str(kv_cache_bytes),
        "--max-batch-size", str(MAX_BATCH_SIZE),
        "--max-batch-prefill-tokens", str(PREFILL_CHUNK),
        "--max-input-tokens", str(MAX_TOTAL_TOKENS // 2),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        # No state checkpoints: prefix reuse turns off, and the whole budget is KV blocks.
        "--max-state-checkpoints", "0",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def reference(lfm2_dir: Path) -> Reference:
    return Reference(lfm2_dir)


@BOTH_FAMILIES
def test_greedy_tokens_equal_transformers_alone_and_together(server: TandemServer, reference: Reference) -> None:
    assert len(reference.encode(PROMPTS[-1])) > PREFILL_CHUNK
    expected = [reference.greedy(prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
    for prompt, want in zip(PROMPTS, expected, strict=True):
        reference.assert_same_greedy(prompt, want, server.generate_ids(prompt, MAX_NEW_TOKENS))
    # Together: one request decodes while another's prompt is prefilled in chunks.
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: server.generate_ids(prompt, MAX_NEW_TOKENS), PROMPTS))
    for prompt, want, got in zip(PROMPTS, expected, together, strict=True):
        reference.assert_same_greedy(prompt, want, got)


@BOTH_FAMILIES
def test_without_state_checkpoints_prefix_reuse_is_off_and_a_repeated_prompt_gives_the_same_tokens(
    server: TandemServer,
) -> None:
    info = server.info()
    assert (info["prefix_caching"], info["model_recurrent_state"], info["state_checkpoints"]) == (False, True, 0), info
    assert info["kv_cache_bytes_per_token"] == attention_bytes_per_token(), info
    assert "prefix caching off" in server.log_tail(400)
    prompt = PROMPTS[-1]
    cold = server.generate_ids(prompt, MAX_NEW_TOKENS)
    warm = server.generate_ids(prompt, MAX_NEW_TOKENS)
    assert warm == cold
    assert server.metric("tandem_prefix_cache_hits_tokens_total") == 0


@DENSE_ONLY
def test_preempted_requests_keep_their_alone_tokens(server: TandemServer, reference: Reference) -> None:
    prompts = [f"Story {i}: the old keeper heard a knock on the door, set down his lantern and" for i in range(6)]
    max_new_tokens = 24
    blocks_per_request = -(-(len(reference.encode(prompts[0])) + max_new_tokens) // 16)
    assert blocks_per_request * MAX_BATCH_SIZE > KV_CACHE_BLOCKS
    preemptions_before = server.metric("tandem_preemptions_total")
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        together = list(pool.map(lambda prompt: server.generate_ids(prompt, max_new_tokens), prompts))
    assert server.metric("tandem_preemptions_total") > preemptions_before
    for prompt, ids in zip(prompts, together, strict=True):
        reference.assert_same_greedy(prompt, reference.greedy(prompt, max_new_tokens), ids)


@DENSE_ONLY
def test_cancelled_streams_free_their_state_slots(server: TandemServer, reference: Reference) -> None:
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 60}}
    # More cancelled requests than slots: a slot a cancelled request kept would leave none for the next ones.
    for _ in range(MAX_BATCH_SIZE + 2):
        with requests.post(f"{server.base_url}/generate_stream", json=body, stream=True, timeout=60) as response:
            assert response.status_code == 200, response.text
            events = (line for line in response.iter_lines(decode_unicode=True) if line.startswith("data:"))
            next(events)
            next(events)
    assert server.wait_for_metric("tandem_running_requests", 0, timeout=30) == 0
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: server.generate_ids(prompt, MAX_NEW_TOKENS), PROMPTS))
    for prompt, ids in zip(PROMPTS, together, strict=True):
        reference.assert_same_greedy(prompt, reference.greedy(prompt, MAX_NEW_TOKENS), ids)
