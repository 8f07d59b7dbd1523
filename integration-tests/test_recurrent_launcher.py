"""Small random hybrids through the real launcher: Qwen3.5 (Gated DeltaNet layers beside gated attention), Qwen3-Next
(the same with experts), Granite 4.0-H (Mamba-2 layers beside attention without rotary, Granite's multipliers, routed
experts beside the shared MLP) and Nemotron-H (Mamba-2, attention and relu² MLP blocks per
`hybrid_override_pattern`): greedy tokens equal transformers' for prompts run alone and together, one prompt longer
than a prefill chunk and the recurrent layers' chunks, prefilled over two steps; prefix reuse is off, and no request
is left running once they are done."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from reference import Reference
from tandem_harness import FLOAT32_EAGER, TandemServer, embedded_model_dir
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

MAX_NEW_TOKENS = 12
# Mamba-2: attention on one layer in three, the others a convolution state and a scan memory, no KV blocks.
MAMBA2_LAYERS = ["mamba", "attention", "mamba"]
MAX_TOTAL_TOKENS = 256
# The longest prompt takes two steps to prefill, the first crossing a delta-rule chunk (64 tokens) and each the
# Mamba-2 scan's (32).
PREFILL_CHUNK = 80
MAX_BATCH_SIZE = 3
LONG_PROMPT = " ".join(
    f"On day {day} the keeper of the lighthouse wrote down the wind, the tide and every passing ship."
    for day in range(1, 7)
)
PROMPTS = ("The capital of France is", "def fibonacci(n):\n", LONG_PROMPT)


# Gated DeltaNet: attention on one layer in three, the others a convolution state and a delta-rule memory.
GATED_DELTA_NET_LAYERS = ["linear_attention", "full_attention", "linear_attention"]
# Qwen3-Next: the same layers with a mixture of experts (a gated shared expert beside them) after each.
EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
}


def gated_delta_net(
    config_class: type[PretrainedConfig], model_class: type[PreTrainedModel], **extra: Any
) -> Callable[[dict[str, int]], PreTrainedModel]:
    def build(tokens: dict[str, int]) -> PreTrainedModel:
        config = config_class(
            **tokens,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=len(GATED_DELTA_NET_LAYERS),
            layer_types=GATED_DELTA_NET_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            max_position_embeddings=MAX_TOTAL_TOKENS,
            initializer_range=0.2,
            **extra,
        )
        return model_class(config)

    return build


def granite_hybrid(tokens: dict[str, int]) -> PreTrainedModel:
    config = GraniteMoeHybridConfig(
        **tokens,
        hidden_size=64,
        intermediate_size=32,
        shared_intermediate_size=96,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=len(MAMBA2_LAYERS),
        layer_types=MAMBA2_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_chunk_size=32,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=2.0,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
    )
    return GraniteMoeHybridForCausalLM(config)


def nemotron_h(tokens: dict[str, int]) -> PreTrainedModel:
    config = NemotronHConfig(
        **tokens,
        hidden_size=64,
        intermediate_size=96,
        # A Mamba-2 layer, a relu² MLP block, attention without rotary, then both again.
        hybrid_override_pattern="M-*M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=32,
        n_groups=2,
        ssm_state_size=16,
        chunk_size=32,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
    )
    return NemotronHForCausalLM(config)


FAMILIES = {
    "qwen3_5": gated_delta_net(Qwen3_5TextConfig, Qwen3_5ForCausalLM),
    "qwen3_next": gated_delta_net(Qwen3NextConfig, Qwen3NextForCausalLM, **EXPERTS),
    "granite-hybrid": granite_hybrid,
    "nemotron-h": nemotron_h,
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random checkpoint of each family, speaking the embedded model's tokenizer."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp(request.param)
    embedded_config = json.loads((embedded / "config.json").read_text())
    tokens = {name: embedded_config[name] for name in ("vocab_size", "bos_token_id", "eos_token_id")}
    torch.manual_seed(0)
    model = FAMILIES[request.param]({**tokens, "pad_token_id": 0})
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Their inits are constant or in head order; routers start at zero.
            if name.endswith(("dt_bias", ".D", "router.weight")):
                param.copy_(torch.randn_like(param))
    model.save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    server = TandemServer.start(
        tmp_path_factory.mktemp(f"{model_dir.name}-serve") / "launcher.log",
        "--model-id", str(model_dir), *FLOAT32_EAGER,
        "--kv-cache-memory", str(8 * 1024 * 1024),
        "--max-batch-size", str(MAX_BATCH_SIZE),
        "--max-batch-prefill-tokens", str(PREFILL_CHUNK),
        "--max-input-tokens", str(MAX_TOTAL_TOKENS // 2),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
    )  # fmt: skip
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


def test_prefix_reuse_is_off_and_a_repeated_prompt_gives_the_same_tokens(server: TandemServer) -> None:
    info = server.info()
    assert (info["prefix_caching"], info["model_recurrent_state"]) == (False, True), info
    cold = server.generate_ids(LONG_PROMPT, MAX_NEW_TOKENS)
    assert server.generate_ids(LONG_PROMPT, MAX_NEW_TOKENS) == cold
    assert server.metric("tandem_prefix_cache_hits_tokens_total") == 0
