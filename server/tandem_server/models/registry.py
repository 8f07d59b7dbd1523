"""Maps `config.architectures[0]` to the class implementing that model family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from tandem_server.distributed import ParallelContext
from tandem_server.errors import UnsupportedArchitectureError
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, LayerCache
from tandem_server.models.config import ModelSpec
from tandem_server.models.llama import LlamaForCausalLM


class CausalLM(Protocol):
    """What the engine needs from a model family."""

    spec: ModelSpec

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def skipped_checkpoint_tensors(self) -> frozenset[str]: ...


class CausalLMFactory(Protocol):
    """A model family's constructor."""

    def __call__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> CausalLM: ...


MODEL_FAMILIES: dict[str, CausalLMFactory] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
}


def model_factory(architecture: str) -> CausalLMFactory:
    """The registered class for `architecture`, or an error listing every supported one."""
    if architecture not in MODEL_FAMILIES:
        raise UnsupportedArchitectureError(architecture, list(MODEL_FAMILIES))
    return MODEL_FAMILIES[architecture]
