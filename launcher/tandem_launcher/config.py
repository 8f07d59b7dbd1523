"""The launcher's typed configuration, built once from flags and environment variables."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem_server.interfaces.attention import DEFAULT_BLOCK_SIZE

from tandem_launcher.cluster import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    DEFAULT_RENDEZVOUS_TIMEOUT_S,
    DEFAULT_SHARD_GRPC_PORT,
    NodeLayout,
    cluster_problems,
)
from tandem_launcher.fault_flags import fault_problems
from tandem_launcher.forwarded import defaults, forwarded_problems
from tandem_launcher.lora_adapters import AdapterSpec, adapter_problems
from tandem_launcher.router_flags import ROUTER_FLAGS
from tandem_launcher.shard_flags import SHARD_FLAGS, device_problems
from tandem_launcher.speculation import speculation_problems
from tandem_launcher.tracing_flags import DEFAULT_SERVICE_NAME, tracing_problems

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_MODEL_CACHE_DIR = Path.home() / ".cache" / "tandem" / "models"
DEVICES = ("auto", "cpu", "cuda")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Every flag forwarded to a child as it is, declared once in its table.
FORWARDED_FLAGS = ROUTER_FLAGS + SHARD_FLAGS
# What `--device auto` becomes once the GPUs are counted.
RESOLVED_DEVICES = ("cpu", "cuda")
ROUTER_START_TIMEOUT_S = 120.0
# Warmup under --torch-compile compiles every graph steps need: the embedded model's start took 158 s on 2 cores with
# an empty Inductor cache.
COMPILING_ROUTER_START_TIMEOUT_S = 900.0


def _console_script(name: str) -> tuple[str, ...]:
    """Prefer the script installed beside this interpreter, so an unactivated venv still works."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return (str(beside_python),)
    return (shutil.which(name) or name,)


@dataclass(frozen=True)
class ChildCommands:
    """argv prefixes of the children; tests put small fake programs here."""

    shard: tuple[str, ...] = field(default_factory=lambda: _console_script("tandem-shard"))
    router: tuple[str, ...] = field(default_factory=lambda: _console_script("tandem-router"))


@dataclass(frozen=True)
class LauncherConfig:
    """Everything one launch needs; token limits left as None are derived from the model."""

    model_id: str = EMBEDDED_MODEL_ID
    revision: str | None = None
    # A .gguf file inside the repo (or directory) model_id names; only it is fetched, then converted.
    gguf_file: str | None = None
    # The Hugging Face token for the launcher's own download (never passed to a child); None: HF_TOKEN.
    hf_token_file: Path | None = None
    # Tensor-parallel ranks across every node; each of the `nnodes` nodes runs num_shard / nnodes of them.
    num_shard: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    shard_grpc_port: int = DEFAULT_SHARD_GRPC_PORT
    cluster_secret_file: Path | None = None
    # Worker node addresses in node order (node 1 first); empty: derived from master_addr (LeaderWorkerSet names).
    worker_addr: tuple[str, ...] = ()
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT_S
    device: str = "cpu"
    hostname: str = "127.0.0.1"
    port: int = 3000
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    # Why the KV blocks have `block_size` tokens, for the start-up log.
    block_size_reason: str = "--block-size"
    # Draft tokens per decode step (speculative decoding); 0: off. Drafts come from `speculative_method`; no step
    # drafts while more than `speculative_disable_by_batch_size` requests run. Method draft: from the draft model
    # `speculative_model`, resolved as `model_id` is and loaded by every shard.
    speculate: int = 0
    speculative_method: str = "ngram"
    speculative_disable_by_batch_size: int = 4
    speculative_model: str | None = None
    speculative_model_revision: str | None = None
    # LoRA adapters every shard loads (`--lora-adapters`, `--lora-modules`), resolved as `model_id` is.
    lora_adapters: tuple[AdapterSpec, ...] = ()
    model_cache_dir: Path = DEFAULT_MODEL_CACHE_DIR
    shard_start_timeout: float = 300.0
    # Covers the shards' Warmup; None: `ROUTER_START_TIMEOUT_S`, or `COMPILING_ROUTER_START_TIMEOUT_S` with
    # --torch-compile, whose Warmup compiles its graphs.
    router_start_timeout: float | None = None
    graceful_termination_timeout: float = 90.0
    max_restarts: int = 3
    restart_window: float = 600.0
    shard_health_timeout: float = 30.0
    step_timeout: float = 120.0
    api_key: tuple[str, ...] = field(default=(), repr=False)  # never shown in logs or tracebacks
    api_key_file: tuple[Path, ...] = ()
    allow_pickle_weights: bool = False
    # Tests only, as RANK:STEP (see the shard's --fault-inject-step-*); the first shard group gets them.
    fault_inject_step_error: str | None = None
    fault_inject_step_hang: str | None = None
    json_output: bool = False
    log_level: str = "info"
    # Rank r serves shard metrics on shard_metrics_port + r; 0 turns shard metrics off.
    shard_metrics_port: int = 0
    # Request tracing (tracing_flags.py): the OTLP/HTTP receiver (None: off), the share of requests traced, and the
    # service name the children's names are made from.
    otlp_endpoint: str | None = None
    otlp_sample_ratio: float = 1.0
    otlp_service_name: str = DEFAULT_SERVICE_NAME
    # The values of the flags forwarded to a child as they are (FORWARDED_FLAGS), by `Forwarded.dest`; entries left
    # out take their flag's default.
    forwarded: Mapping[str, Any] = field(default_factory=dict)
    commands: ChildCommands = field(default_factory=ChildCommands)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.forwarded) - {entry.dest for entry in FORWARDED_FLAGS})
        if unknown:
            raise ValueError(f"not forwarded flags: {', '.join(unknown)}")
        object.__setattr__(self, "forwarded", {**defaults(FORWARDED_FLAGS), **self.forwarded})
        problems = _problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def layout(self) -> NodeLayout:
        """The global ranks this node runs."""
        return NodeLayout(self.node_rank, self.num_shard // self.nnodes)

    @property
    def router_start_timeout_s(self) -> float:
        """How long the router may take to warm the shards up and become healthy."""
        if self.router_start_timeout is not None:
            return self.router_start_timeout
        compiling_at_warmup = self.forwarded["torch_compile"] == "warmup"
        return COMPILING_ROUTER_START_TIMEOUT_S if compiling_at_warmup else ROUTER_START_TIMEOUT_S

    @property
    def is_leader(self) -> bool:
        """Node 0 runs the router; the others run only their ranks."""
        return self.node_rank == 0


def _api_key_problems(config: LauncherConfig) -> list[str]:
    """Keys must be printable ASCII without spaces (as the router checks); the message never shows them."""
    problems = []
    for index, key in enumerate(config.api_key):
        if not key or not all(33 <= ord(char) <= 126 for char in key):
            problems.append(f"--api-key number {index + 1} must be printable ASCII without spaces")
    problems += [f"--api-key-file {path} is not a readable file" for path in config.api_key_file if not path.is_file()]
    return problems


def _model_source_problems(config: LauncherConfig) -> list[str]:
    problems = []
    if config.gguf_file is not None and not config.gguf_file.endswith(".gguf"):
        problems.append(f"--gguf-file must name a .gguf file, got {config.gguf_file!r}")
    if config.hf_token_file is not None and not config.hf_token_file.is_file():
        problems.append(f"--hf-token-file {config.hf_token_file} is not a readable file")
    if config.speculative_model_revision is not None and config.speculative_model is None:
        problems.append("--speculative-model-revision is the revision of a --speculative-model: give that too")
    return problems


def _problems(config: LauncherConfig) -> list[str]:
    positive = {
        "--num-shard": config.num_shard,
        "--block-size": config.block_size,
        "--shard-start-timeout": config.shard_start_timeout,
        "--restart-window": config.restart_window,
        "--shard-health-timeout": config.shard_health_timeout,
        "--step-timeout": config.step_timeout,
        "--rendezvous-timeout": config.rendezvous_timeout,
    }
    problems = [f"{flag} must be positive, got {value}" for flag, value in positive.items() if value <= 0]
    optional_positive = {
        "--max-input-tokens": config.max_input_tokens,
        "--max-total-tokens": config.max_total_tokens,
        "--router-start-timeout": config.router_start_timeout,
    }
    problems += [
        f"{flag} must be positive, got {value}"
        for flag, value in optional_positive.items()
        if value is not None and value <= 0
    ]
    if config.speculate < 0:
        problems.append(f"--speculate must not be negative, got {config.speculate}")
    problems += _api_key_problems(config)
    problems += _model_source_problems(config)
    problems += _cluster_problems(config)
    speculation = (config.speculate, config.speculative_method, config.speculative_disable_by_batch_size)
    problems += speculation_problems(*speculation, config.forwarded["prefix_caching"], config.speculative_model)
    lora_limits = (config.forwarded["max_loras"], config.forwarded["max_cpu_loras"])
    problems += adapter_problems(config.lora_adapters, *lora_limits)
    if config.max_restarts < 0:
        problems.append(f"--max-restarts must not be negative, got {config.max_restarts}")
    if config.graceful_termination_timeout < 0:
        timeout = config.graceful_termination_timeout
        problems.append(f"--graceful-termination-timeout must not be negative, got {timeout}")
    if not 0 < config.port < 65536:
        problems.append(f"--port must be in 1..65535, got {config.port}")
    last_metrics_port = config.shard_metrics_port + config.num_shard - 1
    if config.shard_metrics_port < 0 or (config.shard_metrics_port and last_metrics_port > 65535):
        problems.append(f"--shard-metrics-port must be 0 or leave room for {config.num_shard} ports below 65536")
    if config.log_level not in LOG_LEVELS:
        problems.append(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    problems += fault_problems(config.fault_inject_step_error, config.fault_inject_step_hang, config.num_shard)
    problems += tracing_problems(config.otlp_endpoint, config.otlp_sample_ratio, config.otlp_service_name)
    return problems + _forwarded_problems(config)


def _forwarded_problems(config: LauncherConfig) -> list[str]:
    """The forwarded flags' own checks, then (when those pass) the options the shards' device cannot use."""
    if config.device not in RESOLVED_DEVICES:
        return [f"--device must be one of {', '.join(RESOLVED_DEVICES)}, got {config.device!r}"]
    problems = forwarded_problems(FORWARDED_FLAGS, config.forwarded)
    return problems or device_problems(config.device, config.forwarded)


def _cluster_problems(config: LauncherConfig) -> list[str]:
    local = config.num_shard // max(1, config.nnodes)
    problems = []
    if config.worker_addr and len(config.worker_addr) != config.nnodes - 1:
        problems.append(
            f"--worker-addr is given {len(config.worker_addr)} time(s); --nnodes {config.nnodes} needs one per worker "
            f"node ({config.nnodes - 1})"
        )
    return problems + cluster_problems(
        num_shard=config.num_shard,
        nnodes=config.nnodes,
        node_rank=config.node_rank,
        ports={
            "--master-port": config.master_port,
            "--shard-grpc-port": config.shard_grpc_port,
            "--shard-grpc-port + local ranks - 1": config.shard_grpc_port + max(local, 1) - 1,
        },
        secret_file=config.cluster_secret_file,
    )
