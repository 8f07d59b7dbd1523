"""The embedded SmolLM2 GGUF converts once into a complete, servable safetensors directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from resolution_testing import resolve_model
from safetensors import safe_open
from tandem_launcher import embedded
from tandem_launcher.config import EMBEDDED_MODEL_ID
from tandem_launcher.embedded import (
    CONVERSION_LAYOUT,
    EMBEDDED_CACHE_PREFIX,
    GgufConversionError,
    converted_model_dir,
    embedded_gguf,
)
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR, GGUF_TYPES_KEY

# The slow tier (converts the embedded GGUF): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

SMOLLM2_EOS_ID = 2


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("models")
    return resolve_model(EMBEDDED_MODEL_ID, None, cache).path


def test_cache_name_carries_the_gguf_content_hash_and_the_conversion_layout() -> None:
    source = embedded_gguf()
    assert source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and source.path.is_file()
    prefix, digest, layout = source.cache_name.rsplit("-", 2)
    assert prefix == EMBEDDED_CACHE_PREFIX and len(digest) == 12 and layout == CONVERSION_LAYOUT


@pytest.mark.timeout(180)
def test_conversion_writes_fp32_weights_tokenizer_chat_template_and_eos(converted: Path) -> None:
    assert converted.name == embedded_gguf().cache_name
    assert not [path for path in converted.parent.iterdir() if ".partial-" in path.name]
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["eos_token_id"] == SMOLLM2_EOS_ID
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == SMOLLM2_EOS_ID
    tokenizer_config = json.loads((converted / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>assistant" in tokenizer_config["chat_template"]
    assert (converted / "chat_template.jinja").read_text() == tokenizer_config["chat_template"]
    assert (converted / "model.safetensors").stat().st_size > 500_000_000


@pytest.mark.timeout(180)
def test_conversion_keeps_every_q4_1_and_q8_0_tensor_as_its_blocks(converted: Path) -> None:
    with safe_open(str(converted / GGUF_BLOCKS_DIR / "model.safetensors"), framework="pt") as handle:
        types = json.loads(handle.metadata()[GGUF_TYPES_KEY])
    assert sorted(types.values()).count("Q4_1") == 30 * 7
    assert types["model.embed_tokens.weight"] == "Q8_0"


@pytest.mark.timeout(180)
def test_converted_model_answers_a_chat_prompt_sensibly(converted: Path) -> None:
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_a_second_resolution_reuses_the_cached_conversion(converted: Path) -> None:
    marker = converted / "config.json"
    before = marker.stat().st_mtime_ns
    assert converted_model_dir(embedded_gguf(), converted.parent) == converted
    assert marker.stat().st_mtime_ns == before


def test_a_failed_conversion_leaves_no_partial_directory(tmp_path: Path, monkeypatch) -> None:
    def explode(_gguf: Path, output_dir: Path) -> None:
        (output_dir / "model.safetensors").write_bytes(b"half")
        raise GgufConversionError("boom")

    monkeypatch.setattr(embedded, "convert_gguf", explode)
    with pytest.raises(GgufConversionError, match="boom"):
        converted_model_dir(embedded_gguf(), tmp_path)
    assert list(tmp_path.iterdir()) == []
