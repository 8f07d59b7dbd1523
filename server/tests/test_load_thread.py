"""The shard loads its model on the model thread, the one thread that later runs every Warmup and Step, so torch's
CPU thread pool has a single owner; a load that fails stops that thread and reports the error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from shard_testing import write_tiny_llama
from tandem_server import cli
from tandem_server.bootstrap import LoadedShard
from tandem_server.config import ShardConfig
from tandem_server.engine.step import WarmupPlan
from tandem_server.errors import ConfigError


def _config(model_dir: Path) -> ShardConfig:
    # Eager: a background compile would outlive the test (conftest.py).
    args = ["--model-path", str(model_dir), "--uds-path", str(model_dir / "s.sock"), "--torch-compile", "off"]
    return cli.config_from_args(args)


def test_the_shard_loads_on_the_thread_that_runs_its_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny_llama(tmp_path)
    loaded_on: list[int] = []
    real_load = cli.load_shard

    def recording_load(config: ShardConfig) -> LoadedShard:
        loaded_on.append(threading.get_ident())
        return real_load(config)

    monkeypatch.setattr(cli, "load_shard", recording_load)
    model_thread, shard = cli.load_on_model_thread(_config(tmp_path))
    try:
        plan = WarmupPlan(block_size=4, max_batch_tokens=16, max_batch_requests=2)
        warmed = model_thread.call(lambda: shard.runner.warmup(plan))
        runs_on = model_thread.call(threading.get_ident)
    finally:
        model_thread.shut_down()
    assert warmed.num_blocks > 0
    assert loaded_on == [runs_on]
    assert runs_on != threading.get_ident()


def test_a_load_that_fails_stops_the_model_thread_and_raises_its_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}')
    before = set(threading.enumerate())
    with pytest.raises(ConfigError, match="NoSuchForCausalLM"):
        cli.load_on_model_thread(_config(tmp_path))
    started = [thread for thread in threading.enumerate() if thread not in before and thread.name == "model"]
    for thread in started:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in started)
