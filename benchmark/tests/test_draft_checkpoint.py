"""A draft model cut from a model: its first layers, with the embeddings, final norm, LM head and tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tandem_bench.draft_checkpoint import write_truncated_checkpoint
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def _write_llama(path: Path) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text("{}")
    return model


def test_the_cut_model_computes_the_first_layers_of_the_source(tmp_path: Path) -> None:
    source = _write_llama(tmp_path / "source")
    target = write_truncated_checkpoint(tmp_path / "source", tmp_path / "draft", 2)
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 2
    assert (target / "tokenizer.json").read_text() == "{}"
    draft = AutoModelForCausalLM.from_pretrained(target).eval()
    ids = torch.tensor([[3, 9, 27, 5, 11]])
    with torch.no_grad():
        hidden = source(ids, output_hidden_states=True).hidden_states[2]
        expected = source.lm_head(source.model.norm(hidden))
        assert torch.allclose(draft(ids).logits, expected, atol=1e-5)


@pytest.mark.parametrize("num_layers", [0, 4])
def test_a_layer_count_the_source_cannot_give_is_refused(tmp_path: Path, num_layers: int) -> None:
    _write_llama(tmp_path / "source")
    with pytest.raises(ValueError, match="has 3 layers; a draft keeps between 1 and 3"):
        write_truncated_checkpoint(tmp_path / "source", tmp_path / "draft", num_layers)
