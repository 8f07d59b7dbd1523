"""The shard's LoRA flags: `--lora-adapter NAME=PATH` adapters load before the shard serves, a bad one fails
start-up naming it, and Info reports `--max-loras` and `--max-lora-rank`."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_testing import AdapterSpec, write_adapter
from shard_testing import write_tiny_llama
from tandem_server.bootstrap import load_shard
from tandem_server.cli import config_from_args
from tandem_server.errors import ConfigError

SPEC = AdapterSpec(rank=8, alpha=16, targets=("q_proj", "down_proj"))


def flags(model: Path, *extra: str) -> list[str]:
    return ["--model-path", str(model), "--uds-path", str(model / "s.sock"), "--dtype", "float32", *extra]


def test_start_up_adapters_load_in_order_and_info_reports_the_limits(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    first = write_adapter(tmp_path / "first", reference, SPEC)
    second = write_adapter(tmp_path / "second", reference, AdapterSpec(rank=16, alpha=16, targets=("v_proj",)))
    config = config_from_args(
        flags(tmp_path / "model", "--lora-adapter", f"b={first}", "--lora-adapter", f"a={second}", "--max-loras", "3")
    )
    assert config.lora_adapters == (("b", first), ("a", second))
    shard = load_shard(config)
    assert [(adapter.name, adapter.rank) for adapter in shard.runner.lora.adapters] == [("b", 8), ("a", 16)]
    assert (shard.info.max_loras, shard.info.max_lora_rank) == (3, 64)


def test_the_default_limits_are_four_adapters_per_step_of_rank_up_to_64(tmp_path: Path) -> None:
    config = config_from_args(flags(tmp_path))
    assert (config.lora_adapters, config.max_loras, config.max_lora_rank) == ((), 4, 64)


def test_a_bad_start_up_adapter_fails_start_up_naming_it(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    adapter = write_adapter(tmp_path / "wide", reference, AdapterSpec(rank=32, alpha=32, targets=("v_proj",)))
    config = config_from_args(flags(tmp_path / "model", "--lora-adapter", f"wide={adapter}", "--max-lora-rank", "16"))
    with pytest.raises(ConfigError, match=r"--lora-adapter wide=.*wide: LoRA adapter 'wide': rank 32 is above"):
        load_shard(config)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora-adapter", "no-path"], r"--lora-adapter 'no-path': expected NAME=PATH"),
        (["--lora-adapter", "=dir"], r"expected NAME=PATH"),
        (["--lora-adapter", "x=a", "--lora-adapter", "x=b"], r"names \['x'\] more than once"),
        (["--lora-adapter", "x=a", "--max-loras", "0"], r"--lora-adapter needs --max-loras of at least 1"),
        (["--max-loras", "-1"], r"--max-loras must be 0 or more"),
        (["--max-lora-rank", "0"], r"--max-lora-rank must be at least 1"),
    ],
)
def test_contradictory_lora_flags_are_refused(tmp_path: Path, extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args(flags(tmp_path, *extra))
