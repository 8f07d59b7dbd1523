"""The shard's `auto` weight settings: a GGUF on the CPU serves its blocks, bfloat16 where the CPU multiplies it
natively, bfloat16 copies of quantized weights for batches on the CPU; a value the user gave is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tandem_server.cli import config_from_args
from tandem_server.quant.mode import QuantizeMode
from tandem_server.weight_defaults import choose_weight_settings
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR


def gguf_model(tmp_path: Path) -> Path:
    (tmp_path / GGUF_BLOCKS_DIR).mkdir()
    (tmp_path / GGUF_BLOCKS_DIR / "model.safetensors").write_bytes(b"")
    return tmp_path


def choose(model: Path, bfloat16_cpu: bool, quantize="auto", dtype="auto", memory="auto", device="cpu"):
    return choose_weight_settings(quantize, dtype, memory, device, model, bfloat16_cpu)


def test_a_gguf_model_on_cpu_serves_its_blocks_and_float_models_stay_float(tmp_path: Path) -> None:
    assert choose(gguf_model(tmp_path), True).quantize is QuantizeMode.GGUF
    assert choose(tmp_path / "float", True).quantize is QuantizeMode.NONE
    assert choose(tmp_path, True, quantize="none").quantize is QuantizeMode.NONE
    assert choose(tmp_path, True, quantize="int8").quantize is QuantizeMode.INT8


def test_activations_are_bfloat16_where_the_cpu_multiplies_it_natively(tmp_path: Path) -> None:
    assert choose(tmp_path, bfloat16_cpu=True).dtype is torch.bfloat16
    assert choose(tmp_path, bfloat16_cpu=False).dtype is torch.float32
    assert choose(tmp_path, bfloat16_cpu=True, dtype="float32").dtype is torch.float32
    assert choose(tmp_path, bfloat16_cpu=False, dtype="bfloat16").dtype is torch.bfloat16


@pytest.mark.parametrize(
    ("memory", "gguf", "expected"),
    [("auto", True, None), ("auto", False, 0), ("1GiB", False, 2**30), ("0", True, 0)],
)
def test_bfloat16_copies_are_auto_for_quantized_weights_unless_given(
    tmp_path: Path, memory: str, gguf: bool, expected: int | None
) -> None:
    model = gguf_model(tmp_path) if gguf else tmp_path
    assert choose(model, True, memory=memory).quantized_dense_memory == expected


def test_cuda_keeps_float_weights_in_bfloat16_without_copies(tmp_path: Path) -> None:
    settings = choose(gguf_model(tmp_path), False, device="cuda")
    assert (settings.quantize, settings.dtype, settings.quantized_dense_memory) == (
        QuantizeMode.NONE,
        torch.bfloat16,
        0,
    )


def test_every_choice_states_its_reason(tmp_path: Path) -> None:
    reasons = choose(gguf_model(tmp_path), True).reasons
    assert reasons == (
        "--quantize gguf: the model is a GGUF: its quantized blocks are served as they are",
        "--dtype bfloat16: the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)",
        "--quantized-dense-memory auto: bfloat16 copies serve batches of 6 or more rows where the CPU has AVX-512 "
        "BF16 or AMX",
    )
    assert choose(tmp_path, False).reasons[1] == (
        "--dtype float32: the CPU has neither AVX-512 BF16 nor AMX, so float32 runs faster"
    )


def test_the_shard_flags_default_to_auto(tmp_path: Path) -> None:
    config = config_from_args(["--model-path", str(gguf_model(tmp_path)), "--uds-path", "/s.sock", "--device", "cpu"])
    assert config.quantize is QuantizeMode.GGUF
    # The three weight flags' and the three device flags' reasons, then --torch-compile's (test_compile_default.py).
    assert len(config.auto_reasons) == 7
