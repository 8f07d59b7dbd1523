"""The launcher's typed configuration, built once from flags and environment variables."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tandem_server.weights.gguf_format import QUANTIZE_CHOICES

from tandem_launcher.attention_pages import DEFAULT_BLOCK_SIZE
from tandem_launcher.cluster import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    DEFAULT_RENDEZVOUS_TIMEOUT_S,
    DEFAULT_SHARD_GRPC_PORT,
    NodeLayout,
    cluster_problems,
)
from tandem_launcher.device_defaults import cuda_graph_sizes, decode_mirror_memory, packed_gemm_rows
from tandem_launcher.fault_flags import fault_problems
from tandem_launcher.speculation import speculation_problems

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_MODEL_CACHE_DIR = Path.home() / ".cache" / "tandem" / "models"
DEVICES = ("auto", "cpu", "cuda")
# The shard's --attention-backend choices (tandem_server.layers.attention.selection.BACKEND_CHOICES).
ATTENTION_BACKENDS = ("auto", "torch", "sdpa", "triton", "flash")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Whether the model's generation_config.json sets OpenAI requests' sampling defaults (the router's flag).
GENERATION_CONFIG_USES = ("auto", "none")
# What `--device auto` becomes once the GPUs are counted.
RESOLVED_DEVICES = ("cpu", "cuda")
ROUTER_START_TIMEOUT_S = 120.0
# Warmup under --torch-compile compiles every graph steps need: the embedded model's start took 158 s on 2 cores with
# an empty Inductor cache.
COMPILING_ROUTER_START_TIMEOUT_S = 900.0

_BATCH_SIZES = re.compile(r"^\s*(\d+\s*(,\s*\d+\s*)*)?$")
_MEMORY_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$", re.IGNORECASE)


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
    dtype: str = "auto"
    hostname: str = "127.0.0.1"
    port: int = 3000
    max_concurrent_requests: int = 128
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int = 512
    max_batch_size: int = 64
    block_size: int = DEFAULT_BLOCK_SIZE
    # Why the KV blocks have `block_size` tokens, for the start-up log.
    block_size_reason: str = "--block-size"
    prefix_caching: bool = True
    # The router sends step N+1 before step N has answered.
    async_scheduling: bool = True
    # Draft tokens per decode step (speculative decoding); 0: off. Drafts come from `speculative_method`; no step
    # drafts while more than `speculative_disable_by_batch_size` requests run. Method draft: from the draft model
    # `speculative_model`, resolved as `model_id` is and loaded by every shard.
    speculate: int = 0
    speculative_method: str = "ngram"
    speculative_disable_by_batch_size: int = 4
    speculative_model: str | None = None
    speculative_model_revision: str | None = None
    # KV-cache events (vLLM's format), passed to the router as flags of the same names; no endpoint: off.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = "kv-events"
    kv_events_hash_seed: str = "0"
    kv_cache_memory: str = "1GiB"
    # The KV cache's dtype, in which attention computes; "auto": the model's dtype.
    kv_cache_dtype: str = "auto"
    cuda_memory_fraction: float = 0.9
    # Comma-separated decode batch sizes, "0" for none; None: 1,2,4,...,64 on CUDA and none on CPU.
    cuda_graphs: str | None = None
    # Comma-separated GEMM row counts with MKL-prepacked weights, "0" for none; None: 32 on CPU and none on CUDA.
    packed_gemm_rows: str | None = None
    # GEMM weight format, one of QUANTIZE_CHOICES or "auto" (the shard chooses: tandem_server/weight_defaults.py).
    quantize: str = "auto"
    # Memory for contiguous copies of decoding requests' K/V; None: the shard's default (half the KV cache's) on
    # CPU, 0 on CUDA.
    decode_mirror_memory: str | None = None
    # Memory for bfloat16 copies of quantized weights, which batches multiply by ("auto": half the available memory);
    # None: "auto", which the shard resolves from the weights and the CPU (tandem_server/weight_defaults.py).
    quantized_dense_memory: str | None = None
    # CPU: decoder layers' stages around attention compiled with torch.compile.
    torch_compile: bool = False
    attention_backend: str = "auto"
    model_cache_dir: Path = DEFAULT_MODEL_CACHE_DIR
    shard_start_timeout: float = 300.0
    # Covers the shards' Warmup; None: `ROUTER_START_TIMEOUT_S`, or `COMPILING_ROUTER_START_TIMEOUT_S` with
    # --torch-compile, whose Warmup compiles its graphs.
    router_start_timeout: float | None = None
    graceful_termination_timeout: float = 90.0
    max_restarts: int = 3
    restart_window: float = 600.0
    shard_health_timeout: float = 30.0
    max_queue_time: float = 60.0
    # Unset: only --max-concurrent-requests bounds the queue.
    max_queued_tokens: int | None = None
    step_timeout: float = 120.0
    api_key: tuple[str, ...] = field(default=(), repr=False)  # never shown in logs or tracebacks
    api_key_file: tuple[Path, ...] = ()
    log_requests: bool = False
    allow_pickle_weights: bool = False
    # Tests only, as RANK:STEP (see the shard's --fault-inject-step-*); the first shard group gets them.
    fault_inject_step_error: str | None = None
    fault_inject_step_hang: str | None = None
    json_output: bool = False
    log_level: str = "info"
    # Rank r serves shard metrics on shard_metrics_port + r; 0 turns shard metrics off.
    shard_metrics_port: int = 0
    # Client-facing API limits and options, passed to the router as flags of the same names.
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_best_of: int = 2
    max_client_batch_size: int = 4
    payload_limit: int = 2_000_000
    # Per-request and per-connection bounds, passed to the router as flags of the same names.
    max_stop_sequence_length: int = 512
    max_stop_token_ids: int = 64
    max_logit_bias: int = 300
    max_tools: int = 128
    max_grammar_bytes: int = 128 * 1024
    max_choices: int = 16
    max_connections: int = 1024
    header_read_timeout: int = 10
    always_include_usage: bool = False
    chat_template: Path | None = None
    disable_chat_completions: bool = False
    generation_config: str = "auto"
    # What /v1/responses keeps for previous_response_id, passed to the router as flags of the same names.
    responses_store_max_entries: int = 1024
    responses_store_max_bytes: int = 64 << 20
    commands: ChildCommands = field(default_factory=ChildCommands)

    def __post_init__(self) -> None:
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
        return COMPILING_ROUTER_START_TIMEOUT_S if self.torch_compile else ROUTER_START_TIMEOUT_S

    @property
    def is_leader(self) -> bool:
        """Node 0 runs the router; the others run only their ranks."""
        return self.node_rank == 0


def bound_flags(config: LauncherConfig, *, positive: bool) -> dict[str, int]:
    """The router's per-request and per-connection bounds by flag: those that must be at least 1 (`positive`), or
    those that 0 turns into "none allowed"."""
    must_be_positive = {
        "--max-stop-sequence-length": config.max_stop_sequence_length,
        "--max-grammar-bytes": config.max_grammar_bytes,
        "--max-choices": config.max_choices,
        "--max-connections": config.max_connections,
        "--header-read-timeout": config.header_read_timeout,
    }
    may_be_zero = {
        "--max-stop-token-ids": config.max_stop_token_ids,
        "--max-logit-bias": config.max_logit_bias,
        "--max-tools": config.max_tools,
    }
    return must_be_positive if positive else may_be_zero


def is_memory_size(text: str) -> bool:
    """True for sizes such as `1GiB`, `512MB`, `24MiB` or a plain byte count."""
    return _MEMORY_SIZE.match(text) is not None


def _is_zero_size(text: str) -> bool:
    # "0", "0GiB" and "0.0 MB" all mean no memory.
    size = _MEMORY_SIZE.match(text)
    return size is not None and float(size.group(1)) == 0.0


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
    problems = []
    positive = {
        "--num-shard": config.num_shard,
        "--max-concurrent-requests": config.max_concurrent_requests,
        "--max-batch-prefill-tokens": config.max_batch_prefill_tokens,
        "--max-batch-size": config.max_batch_size,
        "--block-size": config.block_size,
        "--shard-start-timeout": config.shard_start_timeout,
        "--restart-window": config.restart_window,
        "--shard-health-timeout": config.shard_health_timeout,
        "--max-queue-time": config.max_queue_time,
        "--step-timeout": config.step_timeout,
        "--rendezvous-timeout": config.rendezvous_timeout,
    }
    problems += [f"{flag} must be positive, got {value}" for flag, value in positive.items() if value <= 0]
    optional_positive = {
        "--max-input-tokens": config.max_input_tokens,
        "--max-total-tokens": config.max_total_tokens,
        "--max-queued-tokens": config.max_queued_tokens,
        "--router-start-timeout": config.router_start_timeout,
    }
    problems += [
        f"{flag} must be positive, got {value}"
        for flag, value in optional_positive.items()
        if value is not None and value <= 0
    ]
    api_positive = {
        "--max-best-of": config.max_best_of,
        "--max-client-batch-size": config.max_client_batch_size,
        "--payload-limit": config.payload_limit,
        **bound_flags(config, positive=True),
    }
    problems += [f"{flag} must be positive, got {value}" for flag, value in api_positive.items() if value <= 0]
    api_counts = {
        "--max-stop-sequences": config.max_stop_sequences,
        "--max-top-n-tokens": config.max_top_n_tokens,
        "--responses-store-max-entries": config.responses_store_max_entries,
        "--responses-store-max-bytes": config.responses_store_max_bytes,
        "--speculate": config.speculate,
        **bound_flags(config, positive=False),
    }
    problems += [f"{flag} must not be negative, got {value}" for flag, value in api_counts.items() if value < 0]
    if config.chat_template is not None and not config.chat_template.is_file():
        problems.append(f"--chat-template must be a readable file, got {str(config.chat_template)!r}")
    problems += _api_key_problems(config)
    problems += _model_source_problems(config)
    problems += _cluster_problems(config)
    speculation = (config.speculate, config.speculative_method, config.speculative_disable_by_batch_size)
    problems += speculation_problems(*speculation, config.prefix_caching, config.speculative_model)
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
    if config.device not in RESOLVED_DEVICES:
        problems.append(f"--device must be one of {', '.join(RESOLVED_DEVICES)}, got {config.device!r}")
    problems += _cuda_problems(config)
    for flag, value in (("--dtype", config.dtype), ("--kv-cache-dtype", config.kv_cache_dtype)):
        if value not in DTYPES:
            problems.append(f"{flag} must be one of {', '.join(DTYPES)}, got {value!r}")
    if config.log_level not in LOG_LEVELS:
        problems.append(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    if config.generation_config not in GENERATION_CONFIG_USES:
        choices = ", ".join(GENERATION_CONFIG_USES)
        problems.append(f"--generation-config must be one of {choices}, got {config.generation_config!r}")
    problems += fault_problems(config.fault_inject_step_error, config.fault_inject_step_hang, config.num_shard)
    if not is_memory_size(config.kv_cache_memory):
        problems.append(f"--kv-cache-memory must be a size such as 1GiB or 512MB, got {config.kv_cache_memory!r}")
    return problems


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


TORCH_COMPILE_ON_CUDA = "--torch-compile is a CPU option; CUDA steps replay CUDA graphs (--cuda-graphs) instead"


def _cuda_problems(config: LauncherConfig) -> list[str]:
    problems = []
    if not 0.0 < config.cuda_memory_fraction <= 1.0:
        problems.append(f"--cuda-memory-fraction must be in (0, 1], got {config.cuda_memory_fraction}")
    if config.attention_backend not in ATTENTION_BACKENDS:
        choices = ", ".join(ATTENTION_BACKENDS)
        problems.append(f"--attention-backend must be one of {choices}, got {config.attention_backend!r}")
    if config.cuda_graphs is not None:
        if _BATCH_SIZES.match(config.cuda_graphs) is None:
            problems.append(f"--cuda-graphs must be batch sizes such as 1,2,4,8 or 0, got {config.cuda_graphs!r}")
        elif config.device != "cuda" and cuda_graph_sizes(config) != "0":
            problems.append("--cuda-graphs needs --device cuda; use --cuda-graphs 0 on CPU")
    if config.packed_gemm_rows is not None:
        if _BATCH_SIZES.match(config.packed_gemm_rows) is None:
            problems.append(f"--packed-gemm-rows must be row counts such as 32 or 0, got {config.packed_gemm_rows!r}")
        elif config.device != "cpu" and packed_gemm_rows(config) != "0":
            problems.append("--packed-gemm-rows is a CPU option; use --packed-gemm-rows 0 on CUDA")
    if config.quantize not in ("auto", *QUANTIZE_CHOICES):
        problems.append(f"--quantize must be one of auto, {', '.join(QUANTIZE_CHOICES)}, got {config.quantize!r}")
    elif config.device != "cpu" and config.quantize not in ("auto", "none", "int4", "fp8"):
        problems.append(f"--quantize {config.quantize} is a CPU option; on CUDA use none, int4 or fp8")
    if config.torch_compile and config.device != "cpu":
        problems.append(TORCH_COMPILE_ON_CUDA)
    return problems + _cpu_memory_problems(config)


def _cpu_memory_problems(config: LauncherConfig) -> list[str]:
    """Memory flags that only a CPU shard uses must say none elsewhere."""
    flags = {
        "--decode-mirror-memory": decode_mirror_memory(config),
        "--quantized-dense-memory": config.quantized_dense_memory or "0",
    }
    sizes = {} if config.device == "cpu" else flags
    return [f"{flag} is a CPU option; use {flag} 0 on CUDA" for flag, size in sizes.items() if not _is_zero_size(size)]
