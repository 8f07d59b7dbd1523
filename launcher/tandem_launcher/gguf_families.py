"""Which transformers model a GGUF file becomes, and under which names its tensors land there.

transformers' GGUF loader reads most architectures; the mixture-of-experts families it does not read (Mixtral,
written as `llama` with `llama.expert_count` > 0, and OLMoE, `olmoe`) are read here instead: the config from the
file's metadata, each tensor dequantized and put under the name the family's transformers model gives it, with
llama.cpp's q/k row permutation of the `llama` architecture undone as transformers undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from gguf import GGUFReader
from gguf.quants import dequantize
from transformers import PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    LlamaTensorProcessor,
    Qwen2MoeTensorProcessor,
    TensorProcessor,
    get_gguf_hf_weights_map,
)

from tandem_launcher.gguf_experts import EXPERT_STACK, stack_gate_up
from tandem_launcher.gguf_metadata import moe_config_overrides


class LlamaExpertsTensorProcessor(LlamaTensorProcessor, Qwen2MoeTensorProcessor):
    """The `llama` architecture's q/k un-permutation (its `process`), with Qwen2-MoE's mapping of the stacked experts'
    names (`preprocess_name`, `perform_fallback_tensor_mapping`)."""


@dataclass(frozen=True)
class GgufFamily:
    """A family read here: its transformers model type, the gguf-py architecture its tensor names follow, the config
    field of its expert count, how its tensors are processed, and the transformers class that reads its tokenizer
    (`AutoTokenizer` picks a class from the architecture, which it knows for `llama` but not for `olmoe`)."""

    model_type: str
    architecture: str
    experts_field: str
    processor: type[TensorProcessor]
    tokenizer_class: str


MIXTRAL = GgufFamily("mixtral", "llama", "num_local_experts", LlamaExpertsTensorProcessor, "AutoTokenizer")
OLMOE = GgufFamily("olmoe", "olmoe", "num_experts", Qwen2MoeTensorProcessor, "PreTrainedTokenizerFast")
# GGUF key (after `{architecture}.`) -> config field, the same for every family read here.
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "expert_used_count": "num_experts_per_tok",
    "vocab_size": "vocab_size",
}
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "padding_token_id": "pad_token_id"}


def own_family(reader: GGUFReader) -> GgufFamily | None:
    """The family this file belongs to when it is one read here; None when transformers reads it."""
    architecture = str(reader.fields["general.architecture"].contents())
    if architecture == OLMOE.architecture:
        return OLMOE
    experts = reader.fields.get(f"{architecture}.expert_count")
    if architecture == MIXTRAL.architecture and experts is not None and int(experts.contents()) > 0:
        return MIXTRAL
    return None


def gguf_weight_names(reader: GGUFReader, model: Any) -> tuple[TensorProcessor, dict[str, str]]:
    """The processor of the file's tensors and GGUF tensor name -> `model`'s parameter name."""
    family = own_family(reader)
    config = model.config.to_dict()
    if family is not None:
        processor = family.processor(config=config)
        return processor, get_gguf_hf_weights_map(model, processor, model_type=family.architecture)
    architecture = str(reader.fields["general.architecture"].contents())
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    return processor, get_gguf_hf_weights_map(model, processor)


def load_gguf_model(gguf_path: Path) -> PreTrainedModel:
    """The float32 transformers model of `gguf_path`."""
    reader = GGUFReader(gguf_path)
    family = own_family(reader)
    if family is None:
        config = transformers.AutoConfig.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, **moe_config_overrides(gguf_path)
        )
        return transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, config=config, dtype=torch.float32
        )
    model = transformers.AutoModelForCausalLM.from_config(_config(reader, family), dtype=torch.float32)
    tensors = _float_tensors(reader, model)
    if model.config.tie_word_embeddings:
        tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:  # a tensor missing, left over or of another shape than the metadata says
        raise ValueError(f"{gguf_path.name} does not hold a {family.model_type} model: {error}") from error
    return model.eval()


def load_gguf_tokenizer(gguf_path: Path) -> Any:
    """The tokenizer `gguf_path` describes."""
    family = own_family(GGUFReader(gguf_path))
    tokenizer_class = getattr(transformers, "AutoTokenizer" if family is None else family.tokenizer_class)
    return tokenizer_class.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def _config(reader: GGUFReader, family: GgufFamily) -> Any:
    """The family's transformers config, from the file's metadata."""
    fields = reader.fields
    architecture = family.architecture

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    config = {name: value(f"{architecture}.{key}") for key, name in CONFIG_KEYS.items()}
    config[family.experts_field] = value(f"{architecture}.expert_count")
    config |= {name: value(f"tokenizer.ggml.{key}") for key, name in TOKEN_IDS.items()}
    if config["vocab_size"] is None:
        config["vocab_size"] = len(fields["tokenizer.ggml.tokens"].data)
    rope_theta = value(f"{architecture}.rope.freq_base")
    if rope_theta is not None:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    # llama.cpp writes the output projection only when it is not the embedding matrix.
    config["tie_word_embeddings"] = all(tensor.name != "output.weight" for tensor in reader.tensors)
    config = {name: setting for name, setting in config.items() if setting is not None}
    return transformers.AutoConfig.for_model(family.model_type, **config)


def _float_tensors(reader: GGUFReader, model: Any) -> dict[str, torch.Tensor]:
    """Each tensor of the file dequantized under `model`'s parameter name; a layer's gate and up stacks as one."""
    processor, names = gguf_weight_names(reader, model)
    tensors: dict[str, torch.Tensor] = {}
    gate_up: dict[str, dict[str, np.ndarray]] = {}
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type)
        expert = EXPERT_STACK.fullmatch(tensor.name)
        if expert is not None and expert["part"] != "down":
            gate_up.setdefault(names[expert["stack"]], {})[expert["part"]] = weights
            continue
        processed = processor.process(weights=weights, name=tensor.name)
        hf_name = names.get(expert["stack"] if expert is not None else processed.name)
        if hf_name is not None:
            tensors[hf_name] = torch.from_numpy(np.array(processed.weights, dtype=np.float32))
    for hf_name, parts in gate_up.items():
        tensors[hf_name] = torch.from_numpy(np.array(stack_gate_up(parts), dtype=np.float32))
    return tensors
