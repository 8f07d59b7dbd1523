"""Model FLOPs utilisation: the FLOPs a decoder-only transformer needs per token, against the GPU's bf16 peak.

Counts matrix multiplications only (2 FLOPs per multiply-add), as the PaLM paper's MFU does: the projections and
MLP of every layer, the LM head, and attention's QK^T and PV over the token's context. Norms, rotary, softmax
and sampling are left out, so the figure is a slight underestimate of the work done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Dense bf16 tensor-core peaks (no sparsity) in FLOP/s, from NVIDIA's data sheets, matched by device name.
BF16_PEAK_FLOPS = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),
    ("H800", 989.4e12),
    ("GH200", 989.4e12),
    ("B200", 2250.0e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.05e12),
    ("L4", 121.0e12),
    ("A10G", 70.0e12),
)


@dataclass(frozen=True)
class TransformerShape:
    """The sizes that fix a decoder's FLOPs per token."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> TransformerShape:
        """The shape of a Llama-style `config.json`."""
        num_heads = int(hf["num_attention_heads"])
        return cls(
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
            vocab_size=int(hf["vocab_size"]),
        )

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies: q/k/v/o projections, the gated MLP and the LM head."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attention + mlp) + self.hidden_size * self.vocab_size

    def token_flops(self, context_len: int) -> float:
        """FLOPs of one token attending to `context_len` positions (itself included)."""
        attention = 4 * self.num_layers * self.num_heads * self.head_dim * context_len
        return 2.0 * self.matmul_params + attention

    def prefill_flops(self, prompt_len: int) -> float:
        """FLOPs of a whole prompt: token p attends to p + 1 positions."""
        attention_positions = prompt_len * (prompt_len + 1) // 2
        return 2.0 * self.matmul_params * prompt_len + 4 * self.num_layers * self.num_heads * self.head_dim * (
            attention_positions
        )

    def decode_flops(self, prompt_len: int, output_len: int) -> float:
        """FLOPs of generating `output_len` tokens after the prompt; the first comes from the prefill."""
        return sum(self.token_flops(prompt_len + step) for step in range(1, output_len))


def bf16_peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named like `NVIDIA H200`, or None when it is not in the table."""
    for marker, peak in BF16_PEAK_FLOPS:
        if marker in device_name:
            return peak
    return None


def utilisation(flops: float, seconds: float, peak_flops: float) -> float:
    """Achieved FLOP/s as a fraction of the peak."""
    return flops / seconds / peak_flops if seconds > 0 else 0.0
