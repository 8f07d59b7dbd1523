"""Maps `config.architectures[0]` to the class implementing that model family."""

from __future__ import annotations

from typing import Any, Protocol

from tandem_server.distributed import ParallelContext
from tandem_server.errors import UnsupportedArchitectureError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.causal_lm import CausalLM
from tandem_server.models.deepseek_v3 import DeepseekV3ForCausalLM
from tandem_server.models.gemma3 import Gemma3ForCausalLM
from tandem_server.models.gemma4 import Gemma4ForCausalLM
from tandem_server.models.glm4 import Glm4ForCausalLM
from tandem_server.models.glm4_moe import Glm4MoeForCausalLM
from tandem_server.models.gpt_oss import GptOssForCausalLM
from tandem_server.models.granite import GraniteForCausalLM
from tandem_server.models.granite_hybrid import GraniteMoeHybridForCausalLM
from tandem_server.models.lfm2 import Lfm2ForCausalLM
from tandem_server.models.lfm2_moe import Lfm2MoeForCausalLM
from tandem_server.models.llama import LlamaForCausalLM
from tandem_server.models.mixtral import MixtralForCausalLM
from tandem_server.models.nemotron_h import NemotronHForCausalLM
from tandem_server.models.olmo3 import Olmo3ForCausalLM
from tandem_server.models.olmoe import OlmoeForCausalLM
from tandem_server.models.phi3 import Phi3ForCausalLM
from tandem_server.models.qwen2 import Qwen2ForCausalLM
from tandem_server.models.qwen2_moe import Qwen2MoeForCausalLM
from tandem_server.models.qwen3 import Qwen3ForCausalLM
from tandem_server.models.qwen3_5 import Qwen3_5ForCausalLM
from tandem_server.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from tandem_server.models.qwen3_moe import Qwen3MoeForCausalLM
from tandem_server.models.qwen3_next import Qwen3NextForCausalLM
from tandem_server.models.smollm3 import SmolLM3ForCausalLM
from tandem_server.models.text_part import TEXT_PARTS


class CausalLMFactory(Protocol):
    """A model family's constructor."""

    def __call__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> CausalLM: ...


MODEL_FAMILIES: dict[str, CausalLMFactory] = {
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma4ForCausalLM": Gemma4ForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "GraniteMoeHybridForCausalLM": GraniteMoeHybridForCausalLM,
    "Lfm2ForCausalLM": Lfm2ForCausalLM,
    "Lfm2MoeForCausalLM": Lfm2MoeForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "NemotronHForCausalLM": NemotronHForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3_5MoeForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
}

# The families whose attention adds a learned sink per head: start-up passes over backends that cannot add one.
ATTENTION_SINK_FAMILIES = frozenset({"GptOssForCausalLM"})


def model_factory(architecture: str) -> CausalLMFactory:
    """The registered class for `architecture` (a conditional-generation checkpoint's: the text family it fixes;
    `CheckpointConfig.family` names the one its text configuration chooses), or an error listing every supported
    one."""
    text_part = TEXT_PARTS.get(architecture)
    family = text_part.text_architecture if text_part is not None and text_part.text_architecture else architecture
    if family not in MODEL_FAMILIES:
        raise UnsupportedArchitectureError(architecture, [*MODEL_FAMILIES, *TEXT_PARTS])
    return MODEL_FAMILIES[family]
