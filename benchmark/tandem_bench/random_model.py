"""A random-weight Llama-3-8B-shaped checkpoint, built on the device it will be measured on.

Throughput depends on shapes, not on weight values, so no 16 GB download is needed: tensors are drawn on the
GPU and written as safetensors shards. The tokenizer is an existing one whose vocabulary is padded with added
tokens up to Llama 3's 128,256 entries, so every sampled id decodes to text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# Llama-3-8B's published config.json, minus what only training uses.
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
# Random weights ~ N(0, WEIGHT_STD): small enough that activations stay finite in bfloat16 through 32 layers.
WEIGHT_STD = 0.02
SHARD_BYTES = 4 * 1024**3


def llama3_8b_config(eos_token_id: int, bos_token_id: int, **overrides: Any) -> dict[str, Any]:
    """Llama-3-8B's shape with the special token ids of the tokenizer it will be served with."""
    return {**LLAMA3_8B, "eos_token_id": eos_token_id, "bos_token_id": bos_token_id, **overrides}


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Llama checkpoint with `config`, by its checkpoint name, in layer order."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (q_size, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_size, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_size, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, q_size),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.mlp.gate_proj.weight": (inner, hidden),
            f"{prefix}.mlp.up_proj.weight": (inner, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inner),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


def write_random_checkpoint(directory: Path, config: dict[str, Any], device: str, seed: int = 0) -> int:
    """Draws every tensor on `device` in bfloat16 (norms are ones), writes safetensors shards; returns bytes."""
    import torch  # noqa: PLC0415  (torch is only needed where the checkpoint is built)
    from safetensors.torch import save_file  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generator = torch.Generator(device=device).manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = total = index = 0
    for name, shape in checkpoint_shapes(config).items():
        if len(shape) == 1:
            tensor = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            tensor = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(
                0.0, WEIGHT_STD, generator=generator
            )
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        if shard_bytes >= SHARD_BYTES:
            save_file({k: v.cpu() for k, v in shard.items()}, str(directory / f"model-{index:05d}.safetensors"))
            total, index, shard, shard_bytes = total + shard_bytes, index + 1, {}, 0
    if shard:
        save_file({k: v.cpu() for k, v in shard.items()}, str(directory / f"model-{index:05d}.safetensors"))
        total += shard_bytes
    return total


def write_padded_tokenizer(source: Path, directory: Path, vocab_size: int) -> None:
    """Copies the tokenizer files from `source`, adding `<|pad_N|>` tokens until it has `vocab_size` entries."""
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    missing = vocab_size - tokenizer.get_vocab_size(with_added_tokens=True)
    if missing < 0:
        raise ValueError(f"the tokenizer in {source} already has more than {vocab_size} entries")
    start = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_tokens([AddedToken(f"<|pad_{start + i}|>", special=False) for i in range(missing)])
    tokenizer.save(str(directory / "tokenizer.json"))
