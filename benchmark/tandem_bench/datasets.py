"""Synthetic workloads: random and fixed lengths, shared agent-style prefixes, and multi-turn conversations."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tandem_bench.words import WORDS

DATASET_KINDS = ("random", "fixed", "shared-prefix", "multi-turn")


@dataclass(frozen=True)
class Turn:
    """One user message of `input_len` words, answered with `output_len` tokens."""

    text: str
    input_len: int
    output_len: int


@dataclass(frozen=True)
class Conversation:
    """A unit of work: an optional system prompt and one or more turns sent one after another."""

    system: str | None
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class DatasetConfig:
    """What to generate; lengths are in words (about one token each)."""

    kind: str = "random"
    num_prompts: int = 100
    input_len: int = 64
    output_len: int = 64
    range_ratio: float = 0.0
    prefix_len: int = 256
    num_prefixes: int = 4
    num_turns: int = 3
    seed: int = 0


def random_text(rng: random.Random, num_words: int) -> str:
    """`num_words` words drawn uniformly from the word list."""
    return " ".join(rng.choices(WORDS, k=num_words))


def sample_length(rng: random.Random, mean: int, range_ratio: float) -> int:
    """A length uniform in [mean * (1 - r), mean * (1 + r)], never below 1."""
    low = max(1, round(mean * (1 - range_ratio)))
    high = max(low, round(mean * (1 + range_ratio)))
    return rng.randint(low, high)


def _turn(rng: random.Random, config: DatasetConfig, range_ratio: float) -> Turn:
    input_len = sample_length(rng, config.input_len, range_ratio)
    output_len = sample_length(rng, config.output_len, range_ratio)
    return Turn(text=random_text(rng, input_len), input_len=input_len, output_len=output_len)


def _system_prompt(rng: random.Random, index: int, prefix_len: int) -> str:
    # The agent header makes prefixes distinct from their first words, so no two prefixes share cached blocks.
    header = f"You are agent {index}. Follow these instructions:"
    body_len = max(0, prefix_len - len(header.split()))
    return f"{header} {random_text(rng, body_len)}".strip()


def build_dataset(config: DatasetConfig) -> list[Conversation]:
    """Builds `num_prompts` conversations; the same config and seed always give the same prompts."""
    if config.kind not in DATASET_KINDS:
        raise ValueError(f"unknown dataset {config.kind!r}; choose one of {', '.join(DATASET_KINDS)}")
    rng = random.Random(config.seed)
    if config.kind == "fixed":
        return [Conversation(None, (_turn(rng, config, 0.0),)) for _ in range(config.num_prompts)]
    if config.kind == "random":
        return [Conversation(None, (_turn(rng, config, config.range_ratio),)) for _ in range(config.num_prompts)]
    if config.kind == "shared-prefix":
        prefixes = [_system_prompt(rng, i, config.prefix_len) for i in range(config.num_prefixes)]
        return [
            Conversation(prefixes[i % config.num_prefixes], (_turn(rng, config, config.range_ratio),))
            for i in range(config.num_prompts)
        ]
    return [
        Conversation(None, tuple(_turn(rng, config, config.range_ratio) for _ in range(config.num_turns)))
        for _ in range(config.num_prompts)
    ]


def total_turns(conversations: list[Conversation]) -> int:
    """Number of requests the conversations will send."""
    return sum(len(conversation.turns) for conversation in conversations)
