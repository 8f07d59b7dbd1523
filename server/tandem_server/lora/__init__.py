"""Multi-LoRA serving: PEFT adapters loaded by name, each step's rows run under their request's adapter."""

from tandem_server.lora.adapter import AdapterSummary, LoraAdapter
from tandem_server.lora.registry import BASE_MODEL, LoraLimits, LoraRegistry
from tandem_server.lora.step import LoraStep

__all__ = ["BASE_MODEL", "AdapterSummary", "LoraAdapter", "LoraLimits", "LoraRegistry", "LoraStep"]
