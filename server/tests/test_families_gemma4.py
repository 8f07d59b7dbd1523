"""Gemma 4 text matches transformers over the paged cache, alone and as the text part of its multimodal checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from reference_checks import (
    Target,
    assert_greedy_matches_generate,
    assert_mixed_steps_match_logits,
    warm_for_reference,
)
from safetensors.torch import load_file, save_file
from shard_testing import TINY_SETTINGS, decode_graph, load_tiny_model, make_runner, write_tiny_checkpoint
from tandem_server.config import CompileMode
from tandem_server.errors import ConfigError, UnsupportedArchitectureError
from tandem_server.execution.chain import Execution
from tandem_server.execution.compiled_decode import CompiledExecutor
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.decode_package_executor import DecodePackageExecutor
from tandem_server.execution.kv_cache import CacheGeometry
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.gemma4_config import gemma4_args
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4VisionConfig,
    PreTrainedModel,
    SiglipVisionConfig,
)

# Shorter than the test sequences (up to 24 positions), so an ignored window changes later tokens.
WINDOW = 4
SLIDING, FULL = "sliding_attention", "full_attention"

VARIANTS: dict[str, dict[str, Any]] = {
    # Per-layer inputs; global layers with 32-wide heads and one KV head whose values are the keys; the last three
    # layers reuse the keys and values of layers 3 (sliding) and 2 (global), with double-width MLPs.
    "ple-shared-kv-keys-as-values": {
        "num_hidden_layers": 7,
        "layer_types": [SLIDING, SLIDING, FULL, SLIDING, SLIDING, SLIDING, FULL],
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 3,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 96,
        "final_logit_softcapping": 30.0,
        "sliding_window": WINDOW,
    },
    # Without per-layer inputs or sharing, untied, the default five-to-one pattern, biases, proportional rotary over
    # half the pairs with a factor, and a different base on the sliding layers.
    "untied-pattern-scaled-proportional": {
        "num_hidden_layers": 6,
        "head_dim": 16,
        "global_head_dim": 24,
        "hidden_size_per_layer_input": 0,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "sliding_window": WINDOW + 1,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 1000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0, "rope_theta": 1e4},
        },
    },
}


def randomize_layer_scalars(model: PreTrainedModel) -> None:
    """transformers initialises every `layer_scalar` to one, which would hide one left unapplied."""
    for name, buffer in model.named_buffers():
        if name.endswith("layer_scalar"):
            buffer.uniform_(0.5, 1.5)


def write_gemma4(path: Path, variant: str) -> PreTrainedModel:
    return write_tiny_checkpoint(
        path, Gemma4TextConfig, Gemma4ForCausalLM, randomize=randomize_layer_scalars, **VARIANTS[variant]
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_gemma4(tmp_path, variant)
    assert_mixed_steps_match_logits(tmp_path, reference, variant)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bfloat16_logits_stay_within_transformers_own_bfloat16_error(tmp_path: Path, variant: str) -> None:
    reference = write_gemma4(tmp_path, variant)
    assert_mixed_steps_match_logits(tmp_path, reference, variant, Target(dtype=torch.bfloat16))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, variant: str) -> None:
    reference = write_gemma4(tmp_path, variant)
    assert_greedy_matches_generate(tmp_path, reference, variant, eos_token_id=2)


@pytest.mark.slow
def test_compiled_decode_graphs_give_the_greedy_tokens_of_transformers(tmp_path: Path) -> None:
    # Layers that reuse keys and values hand the source layer's to the backend inside the whole-step graph too.
    reference = write_gemma4(tmp_path, "ple-shared-kv-keys-as-values")
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.WARMUP))
    graph = decode_graph(runner)
    assert graph is not None and graph.compiled_rows == (1, 2, 4, 8)
    steps_at_warmup = graph.steps
    assert_greedy_matches_generate(tmp_path, reference, "gemma4 compiled", runner=runner)
    assert graph.steps > steps_at_warmup


def test_background_compile_skips_the_decode_package_and_compiles_in_process(tmp_path: Path) -> None:
    write_gemma4(tmp_path, "ple-shared-kv-keys-as-values")
    model = load_tiny_model(tmp_path)
    package = DecodePackageSpec(
        model_path=str(tmp_path),
        dtype="float32",
        kv_cache_dtype="float32",
        quantize="none",
        dense_copy_memory=0,
        packed_gemm_rows=(),
        allow_pickle_weights=False,
        num_threads=1,
        cache_dir=str(tmp_path / "compiled"),
    )
    execution = Execution.build(model, torch.device("cpu"), CompileMode.BACKGROUND, package)
    assert execution.executor(DecodePackageExecutor) is None
    assert execution.executor(CompiledExecutor) is not None


def test_layers_that_reuse_keys_and_values_keep_no_cache_and_heads_differ_by_layer(tmp_path: Path) -> None:
    write_gemma4(tmp_path, "ple-shared-kv-keys-as-values")
    spec = load_tiny_model(tmp_path).spec
    # Layers 0-3 own their caches (layer 2 global: 1 KV head of 32); layers 4-6 read those of layers 3 and 2.
    assert spec.cache_shapes == ((2, 16), (2, 16), (1, 32), (2, 16))
    geometry = CacheGeometry.of(spec, 4, torch.float32)
    assert geometry.bytes_per_token == 2 * (3 * 2 * 16 + 32) * 4


def _text_config(**overrides: Any) -> Gemma4TextConfig:
    return Gemma4TextConfig(**{**TINY_SETTINGS, **VARIANTS["ple-shared-kv-keys-as-values"], **overrides})


def write_gemma4_conditional(path: Path) -> PreTrainedModel:
    """A Gemma 4 multimodal checkpoint with a tiny vision tower, saved as transformers saves it."""
    torch.manual_seed(0)
    vision = Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        position_embedding_size=64,
    )
    config = Gemma4Config(text_config=_text_config(), vision_config=vision, audio_config=None)
    config._attn_implementation = "eager"
    reference = Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
        randomize_layer_scalars(reference)
    reference.save_pretrained(path)
    return reference


def test_conditional_generation_checkpoint_serves_its_text_part(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = write_gemma4_conditional(tmp_path)
    checkpoint = read_checkpoint_config(tmp_path)
    assert (checkpoint.architecture, checkpoint.skipped_parts) == ("Gemma4ForConditionalGeneration", ("vision",))
    with caplog.at_level(logging.INFO, logger="tandem_server.models.loader"):
        model = load_tiny_model(tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        "Gemma4ForConditionalGeneration: serving its text decoder as Gemma4ForCausalLM; not loaded: vision"
    ]
    assert type(model).__name__ == "Gemma4ForCausalLM"
    assert_greedy_matches_generate(tmp_path, reference, "gemma4-conditional", eos_token_id=2)


def write_gemma3_conditional(path: Path) -> PreTrainedModel:
    """A Gemma 3 multimodal checkpoint with a tiny SigLIP tower, saved as transformers 5 saves it."""
    torch.manual_seed(0)
    # Gemma3TextConfig's own head counts, so that the published layout leaves them out.
    heads = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16}
    text = {**TINY_SETTINGS, **heads, "sliding_window": WINDOW, "layer_types": [SLIDING, FULL]}
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4
    )
    config = Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4)
    config._attn_implementation = "eager"
    reference = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
    reference.save_pretrained(path)
    return reference


def as_published_gemma3(path: Path) -> None:
    """Rewrites a saved Gemma 3 multimodal checkpoint into the layout google/gemma-3-*-it ship: tensors under
    `language_model.model.`, `vision_tower.` and `multi_modal_projector.`, and a `text_config` that lists only the
    settings that differ from Gemma3TextConfig's defaults."""
    tensors = load_file(path / "model.safetensors")
    renamed = {
        name.replace("model.language_model.", "language_model.model.", 1).removeprefix("model."): tensor
        for name, tensor in tensors.items()
    }
    assert any(name.startswith("vision_tower.") for name in renamed)
    save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    defaults = Gemma3TextConfig().to_dict()
    text = config["text_config"]
    config["text_config"] = {key: value for key, value in text.items() if key not in defaults or value != defaults[key]}
    assert "num_attention_heads" not in config["text_config"] and "query_pre_attn_scalar" not in config["text_config"]
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("published", [False, True], ids=["saved", "published-layout"])
def test_gemma3_conditional_generation_checkpoint_serves_its_text_part(tmp_path: Path, published: bool) -> None:
    reference = write_gemma3_conditional(tmp_path)
    if published:
        as_published_gemma3(tmp_path)
    assert read_checkpoint_config(tmp_path).skipped_parts == ()
    assert_greedy_matches_generate(tmp_path, reference, "gemma3-conditional", eos_token_id=2)


def _write_config(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_unknown_architecture_stops_start_up_naming_it(tmp_path: Path) -> None:
    checkpoint = _write_config(tmp_path, {"architectures": ["Gemma9ForConditionalGeneration"], **TINY_SETTINGS})
    with pytest.raises(UnsupportedArchitectureError, match="'Gemma9ForConditionalGeneration'") as raised:
        load_tiny_model(checkpoint)
    assert {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"} <= set(raised.value.supported)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"enable_moe_block": True}, "enable_moe_block"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"per_layer_config": {"6": {"intermediate_size": 64}}}, r"overrides \['intermediate_size'\] on layer 6"),
        ({"num_kv_shared_layers": 5}, "no earlier layer is one"),
    ],
)
def test_unsupported_gemma4_options_stop_start_up_naming_them(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    config = {**_text_config().to_dict(), "architectures": ["Gemma4ForCausalLM"], **overrides}
    with pytest.raises(ConfigError, match=message):
        load_tiny_model(_write_config(tmp_path, config))


def test_per_layer_inputs_default_as_in_transformers_and_turn_off_with_zero() -> None:
    config = _text_config().to_dict()
    del config["hidden_size_per_layer_input"]
    assert gemma4_args(config).per_layer_input_size == Gemma4TextConfig().hidden_size_per_layer_input == 256
    assert gemma4_args({**config, "hidden_size_per_layer_input": 0}).per_layer_input_size == 0
