"""Workload builders: lengths, shared prefixes, multi-turn shape, determinism."""

from __future__ import annotations

import pytest
from tandem_bench.datasets import DatasetConfig, build_dataset, total_turns
from tandem_bench.words import WORDS


def test_fixed_prompts_have_exactly_the_requested_lengths() -> None:
    conversations = build_dataset(DatasetConfig(kind="fixed", num_prompts=20, input_len=64, output_len=32))
    assert len(conversations) == 20
    for conversation in conversations:
        (turn,) = conversation.turns
        assert len(turn.text.split()) == turn.input_len == 64
        assert turn.output_len == 32
        assert conversation.system is None


def test_random_lengths_stay_within_the_range_ratio_and_vary() -> None:
    config = DatasetConfig(kind="random", num_prompts=200, input_len=100, output_len=50, range_ratio=0.5)
    turns = [c.turns[0] for c in build_dataset(config)]
    inputs = [len(t.text.split()) for t in turns]
    assert min(inputs) >= 50 and max(inputs) <= 150
    assert min(t.output_len for t in turns) >= 25 and max(t.output_len for t in turns) <= 75
    assert len(set(inputs)) > 20


def test_prompts_use_only_the_word_list_and_differ_from_each_other() -> None:
    conversations = build_dataset(DatasetConfig(kind="fixed", num_prompts=50, input_len=32))
    texts = [c.turns[0].text for c in conversations]
    assert len(set(texts)) == 50
    assert set(" ".join(texts).split()) <= set(WORDS)


def test_same_seed_gives_the_same_prompts_and_another_seed_does_not() -> None:
    first = build_dataset(DatasetConfig(num_prompts=5, seed=3))
    assert first == build_dataset(DatasetConfig(num_prompts=5, seed=3))
    assert first != build_dataset(DatasetConfig(num_prompts=5, seed=4))


def test_shared_prefix_requests_really_share_their_system_prompts() -> None:
    config = DatasetConfig(kind="shared-prefix", num_prompts=12, prefix_len=200, num_prefixes=3, input_len=20)
    conversations = build_dataset(config)
    prefixes = [c.system for c in conversations]
    distinct = list(dict.fromkeys(prefixes))
    assert len(distinct) == 3
    assert all(prefix is not None and len(prefix.split()) == 200 for prefix in distinct)
    assert [prefixes.count(prefix) for prefix in distinct] == [4, 4, 4]
    # Distinct prefixes diverge within their first words, so none is a cached prefix of another.
    assert len({" ".join(str(prefix).split()[:4]) for prefix in distinct}) == 3
    assert len({c.turns[0].text for c in conversations}) == 12


def test_multi_turn_conversations_have_the_requested_turns() -> None:
    config = DatasetConfig(kind="multi-turn", num_prompts=4, num_turns=3, input_len=10, output_len=5)
    conversations = build_dataset(config)
    assert [len(c.turns) for c in conversations] == [3, 3, 3, 3]
    assert total_turns(conversations) == 12


def test_unknown_dataset_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="shared-prefix"):
        build_dataset(DatasetConfig(kind="sharegpt"))
