"""Assembles a loaded ModelRunner and its Info facts from a ShardConfig."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from tandem_server.config import ShardConfig, dtype_name
from tandem_server.distributed import init_distributed
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.layers.attention import create_backend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.rpc.generated import shard_pb2
from tandem_server.rpc.servicer import build_info
from tandem_server.structured import GrammarCompiler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedShard:
    """A runner ready for Warmup and the facts Info reports."""

    runner: ModelRunner
    info: shard_pb2.InfoResponse


def load_shard(config: ShardConfig) -> LoadedShard:
    """Joins the process group, loads the checkpoint for this rank and builds the runner."""
    started = time.perf_counter()
    checkpoint = read_checkpoint_config(config.model_path)
    backend = create_backend(config.attention_backend)
    parallel = init_distributed(config.rank, config.world_size, config.master_addr, config.master_port, config.device)
    device = (
        torch.device(config.device, torch.cuda.current_device()) if config.device == "cuda" else torch.device("cpu")
    )
    model = load_model(checkpoint, config.dtype, device, parallel, backend)
    grammar_compiler = GrammarCompiler.from_model_dir(
        config.model_path, model.spec.vocab_size, checkpoint.eos_token_ids
    )
    runner = ModelRunner(
        model, checkpoint.eos_token_ids, config.dtype, device, config.kv_cache_memory, grammar_compiler
    )
    logger.info(
        "loaded %s (%s on %s, rank %d/%d) in %.1fs",
        checkpoint.architecture,
        dtype_name(config.dtype),
        device,
        parallel.rank,
        parallel.world_size,
        time.perf_counter() - started,
    )
    return LoadedShard(runner, build_info(runner, checkpoint.architecture, backend.name, parallel))
