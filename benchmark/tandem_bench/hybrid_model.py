"""The tiny random-weight hybrid checkpoints `tandem-bench hybrid` serves: recurrent layers beside attention.

`qwen3_5` is Qwen3.5's text model (three Gated DeltaNet layers, then one gated attention layer, repeated);
`granite-hybrid` is Granite 4.0-H Micro's layout (Mamba-2 layers with attention on one in four, a dense SwiGLU after
each). Both speak the embedded model's tokenizer, so every sampled id decodes to text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem_bench.random_model import TOKENIZER_FILES

# Eight layers, hidden 512: two cores prefill a 1,000-token history in well under a second, and the 49,152-token
# vocabulary's embedding and LM head stay a minority of the weights.
QWEN3_5_LAYERS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
QWEN3_5: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": len(QWEN3_5_LAYERS),
    "layer_types": QWEN3_5_LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
GRANITE_HYBRID_LAYERS = ["mamba", "mamba", "mamba", "attention"] * 2
GRANITE_HYBRID: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "shared_intermediate_size": 1536,
    "num_local_experts": 0,
    "num_hidden_layers": len(GRANITE_HYBRID_LAYERS),
    "layer_types": GRANITE_HYBRID_LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "mamba_n_heads": 16,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 64,
    "mamba_chunk_size": 64,
    "position_embedding_type": "nope",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
# Family name -> (transformers config class, model class, the config's sizes).
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN3_5),
    "granite-hybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", GRANITE_HYBRID),
}
# Random weights ~ N(0, INIT_STD), the families' own initializer range.
INIT_STD = 0.02


def hybrid_config(family: str, vocab_size: int, bos_token_id: int, eos_token_id: int) -> dict[str, Any]:
    """The keyword arguments of `family`'s transformers config for a tokenizer of `vocab_size` entries."""
    _, _, sizes = FAMILIES[family]
    return {
        **sizes,
        "vocab_size": vocab_size,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": eos_token_id,
        "initializer_range": INIT_STD,
    }


def write_tiny_hybrid(directory: Path, tokenizer_dir: Path, family: str, dtype: str, seed: int = 0) -> None:
    """Draws `family`'s model with transformers' own initialisation, saves it in `dtype` beside the tokenizer."""
    import torch  # noqa: PLC0415  (only the writer needs torch and transformers)
    import transformers  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    config_name, model_name, _ = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tokenizer.eos_token_id or 0
    config = getattr(transformers, config_name)(
        **hybrid_config(family, len(tokenizer), tokenizer.bos_token_id or 0, eos)
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and name != "generation_config.json":
            (directory / name).write_bytes((tokenizer_dir / name).read_bytes())


def describe_model(config: dict[str, Any]) -> str:
    """A checkpoint's config.json in a few words: its architecture, layers by kind and width."""
    kinds = config.get("layer_types") or []
    attention = sum(1 for kind in kinds if kind in ("full_attention", "attention"))
    return (
        f"{config['architectures'][0]}, {config['num_hidden_layers']} layers ({len(kinds) - attention} recurrent, "
        f"{attention} attention), hidden {config['hidden_size']}, vocabulary {config['vocab_size']}"
    )
