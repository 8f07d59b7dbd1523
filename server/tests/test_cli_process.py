"""`tandem-shard` as a process: the socket appears only once the model is loaded, SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from shard_testing import write_tiny_llama
from tandem_server.cli import main
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc


async def info_over(socket_path: Path) -> shard_pb2.InfoResponse:
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        return await shard_pb2_grpc.ShardServiceStub(channel).Info(shard_pb2.InfoRequest(), timeout=10)


def test_shard_process_serves_info_and_stops_on_sigterm(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "model")
    socket_path = tmp_path / "run" / "shard-0.sock"
    command = [sys.executable, "-m", "tandem_server.cli", "--model-path", str(tmp_path / "model")]
    command += ["--uds-path", str(socket_path), "--num-threads", "1", "--kv-cache-memory", "4MiB"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "shard never bound its socket"
            time.sleep(0.1)
        info = asyncio.run(info_over(socket_path))
        assert info.architecture == "LlamaForCausalLM" and info.vocab_size == 96
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "ready" in (process.stderr.read() if process.stderr else "")
        assert not socket_path.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_shard_exits_with_usage_code_on_unknown_architecture(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    threads = str(torch.get_num_threads())
    assert main(["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s"), "--num-threads", threads]) == 2
    assert "unsupported architecture 'GPT2LMHeadModel'" in caplog.text and "LlamaForCausalLM" in caplog.text
    assert not (tmp_path / "s").exists()
