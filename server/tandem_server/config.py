"""The shard's start-up configuration: one frozen dataclass built from the command line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import torch

from tandem_server.errors import ConfigError
from tandem_server.execution.kv_offload import KvOffloadOptions
from tandem_server.faults import FaultPlan
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY
from tandem_server.quant.mode import QuantizeMode
from tandem_server.telemetry import TracingConfig
from tandem_server.vision.encoder_cache import DEFAULT_ENCODER_CACHE_BYTES

ATTENTION_BACKENDS = ATTENTION_REGISTRY.choices
DEVICES = ("cpu", "cuda")
# int4 runs on CUDA through Tandem's Triton kernel, fp8 through `torch._scaled_mm`; the rest have CPU kernels only.
_CUDA_QUANTIZE_MODES = (QuantizeMode.NONE, QuantizeMode.INT4, QuantizeMode.FP8)
DEFAULT_COMPILE_CACHE_DIR = Path.home() / ".cache" / "tandem" / "compiled"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class CompileMode(StrEnum):
    """`--torch-compile`: when graphs compile, if at all."""

    OFF = "off"
    # Every graph (decode graphs and layer stages) before Warmup returns: the server is ready once they are.
    WARMUP = "warmup"
    # Decode graphs on a thread beside serving, each taking over its steps once compiled; nothing else compiles.
    BACKGROUND = "background"


@dataclass(frozen=True)
class ShardConfig:
    """Everything one shard process needs, fixed for its lifetime."""

    model_path: Path
    uds_path: Path
    # Speculative decoding: a smaller model with the same vocabulary that proposes drafts; None: the router's own.
    draft_model_path: Path | None = None
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # This rank's index on its own node (its GPU); None: `rank` (one node).
    local_rank: int | None = None
    # Seconds every rank may take to arrive at the rendezvous before start-up fails naming the missing ones.
    rendezvous_timeout_s: float = 600.0
    # A TCP port serving the same gRPC service for a router on another node (0: the Unix socket alone); calls on it
    # must present the secret in `cluster_secret_file`.
    grpc_port: int = 0
    grpc_host: str = "127.0.0.1"
    cluster_secret_file: Path | None = None
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    # The paged KV cache's (and decode mirror's) dtype; attention computes in it. None: the model's dtype.
    kv_cache_dtype: torch.dtype | None = None
    # CPU: bytes the KV cache takes; None: `auto` (sized from the model and the machine at Warmup).
    kv_cache_memory: int | None = None
    num_threads: int = 1
    attention_backend: str = "auto"
    # Tokens per KV block the router pages with; None: unknown until Warmup.
    block_size: int | None = None
    # CUDA only: the KV cache takes this share of the device memory left free after a profiling step.
    cuda_memory_fraction: float = 0.9
    # CUDA only: decode-only batch sizes replayed from captured graphs; empty runs every step eagerly.
    cuda_graph_sizes: tuple[int, ...] = ()
    # CPU only: GEMM row counts that get prepacked weights (float32: one MKL copy each; bfloat16: one oneDNN copy
    # packed for the largest); empty: dense only.
    packed_gemm_rows: tuple[int, ...] = ()
    # GEMM weights as int4/int8 (GGUF: the converted model's kept blocks, CPU; int8: quantized at load, CPU; int4:
    # quantized at load, CPU or CUDA), or float8 e4m3 quantized at load (fp8: CPU, or CUDA from compute capability 8.9).
    quantize: QuantizeMode = QuantizeMode.NONE
    # CPU only: bytes for contiguous copies of decoding requests' K/V (the decode mirror); 0: gather every step;
    # None: half of the KV cache, once `auto` has sized it.
    decode_mirror_memory: int | None = 0
    # CPU only: bytes for bfloat16 copies of quantized GEMM weights, which batches multiply by; None: `auto` (half the
    # available memory, split between ranks, where the CPU has bfloat16 matrix instructions); 0: none.
    quantized_dense_memory: int | None = 0
    # Why the `auto` weight, device and compile flags took their values (weight_defaults.py, device_defaults.py,
    # compile_default.py), logged at load.
    auto_reasons: tuple[str, ...] = ()
    # CPU only: when decode graphs (and, at Warmup, layer stages) compile with torch.compile
    # (execution/compiled_decode.py, execution/compiled_layers.py).
    torch_compile: CompileMode = CompileMode.OFF
    # The C++ compiler Inductor would run, where one is on PATH (compile_default.py).
    cpp_compiler: str | None = None
    # Where `background` keeps the decode packages it builds (execution/decode_package.py), across restarts.
    compile_cache_dir: Path = DEFAULT_COMPILE_CACHE_DIR
    log_level: str = "info"
    metrics_port: int = 0
    metrics_hostname: str = "127.0.0.1"
    # Pickle weights (*.bin, *.pt) can run code when loaded: refused unless explicitly allowed.
    allow_pickle_weights: bool = False
    # Each rank holds whole routed experts (a share of them), not a slice of every expert (docs/tensor-parallel.md).
    expert_parallel: bool = False
    # A model job running longer than this makes Health fail (a wedged device); None: never.
    step_timeout_s: float | None = None
    # LoRA adapters (name, local PEFT directory) loaded before the shard reports ready, in this order.
    lora_adapters: tuple[tuple[str, Path], ...] = ()
    # Most distinct LoRA adapters one Step runs (0: none are served), and the highest rank accepted.
    max_loras: int = 4
    max_lora_rank: int = 64
    # Most adapters whose weights stay in memory; None: --max-loras or the start-up adapters, whichever is more.
    max_cpu_loras: int | None = None
    # Bytes of image embeddings the encoder cache keeps (vision-language models; on their device).
    encoder_cache_memory: int = DEFAULT_ENCODER_CACHE_BYTES
    # The tiers that keep KV blocks the router evicts (off by default).
    kv_offload: KvOffloadOptions = field(default_factory=KvOffloadOptions)
    # Test only: a rank that fails or hangs in a chosen Step (see faults.py); empty by default.
    faults: FaultPlan = field(default_factory=FaultPlan)
    # Where the spans of traced Steps go (`--otlp-endpoint`); off by default.
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.grpc_port and self.cluster_secret_file is None:
            raise ConfigError("--grpc-port needs --cluster-secret-file: TCP callers must authenticate")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"unknown attention backend {self.attention_backend!r}; available: {', '.join(ATTENTION_BACKENDS)}"
            )
        self._check_device_options()
        self._check_lora_options()
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ConfigError("--kv-cache-memory must be positive")
        if self.encoder_cache_memory < 0:
            raise ConfigError("--encoder-cache-memory must not be negative")
        if self.num_threads < 1:
            raise ConfigError("--num-threads must be at least 1")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port must be in 0..65535, got {self.metrics_port}")
        for flag, target in (
            ("--fault-inject-step-error", self.faults.step_error),
            ("--fault-inject-step-hang", self.faults.step_hang),
        ):
            if target is not None and target.rank >= self.world_size:
                raise ConfigError(f"{flag} names rank {target.rank}, outside world size {self.world_size}")

    @property
    def launches_ahead(self) -> bool:
        """Whether the device runs a step while the host prepares the next one; on the CPU a launch runs the step."""
        return self.device == "cuda"

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype the KV cache is allocated in."""
        return self.kv_cache_dtype or self.dtype

    def _check_lora_options(self) -> None:
        if self.max_loras < 0:
            raise ConfigError(f"--max-loras must be 0 or more, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ConfigError(f"--max-lora-rank must be at least 1, got {self.max_lora_rank}")
        if self.lora_adapters and self.max_loras == 0:
            raise ConfigError("--lora-adapter needs --max-loras of at least 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(
                f"--max-cpu-loras {self.max_cpu_loras} is below --max-loras {self.max_loras}: every adapter of a step "
                "must be in memory at once"
            )
        names = [name for name, _ in self.lora_adapters]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConfigError(f"--lora-adapter names {repeated} more than once; each adapter needs its own name")

    @property
    def lora_memory_limit(self) -> int:
        """`--max-cpu-loras`, or its default: every start-up adapter stays in memory, and at least `max_loras`."""
        if self.max_cpu_loras is not None:
            return self.max_cpu_loras
        return max(self.max_loras, len(self.lora_adapters))

    def _check_device_options(self) -> None:
        if not 0.0 < self.cuda_memory_fraction <= 1.0:
            raise ConfigError(f"--cuda-memory-fraction must be in (0, 1], got {self.cuda_memory_fraction}")
        if self.cuda_graph_sizes and self.device != "cuda":
            raise ConfigError("--cuda-graphs needs --device cuda; use --cuda-graphs 0 on CPU")
        if self.packed_gemm_rows and self.device != "cpu":
            raise ConfigError("--packed-gemm-rows is a CPU option; use --packed-gemm-rows 0 on CUDA")
        if self.quantize not in _CUDA_QUANTIZE_MODES and self.device != "cpu":
            raise ConfigError(f"--quantize {self.quantize.value} is a CPU option; on CUDA use none, int4 or fp8")
        if self.decode_mirror_memory and self.device != "cpu":
            raise ConfigError("--decode-mirror-memory is a CPU option; use --decode-mirror-memory 0 on CUDA")
        if self.quantized_dense_memory != 0 and self.device != "cpu":
            raise ConfigError("--quantized-dense-memory is a CPU option; use --quantized-dense-memory 0 on CUDA")
        if self.torch_compile is CompileMode.BACKGROUND and self.cpp_compiler is None:
            raise ConfigError("--torch-compile background needs a C++ compiler such as g++ (or CXX) on this machine")
        if self.torch_compile is not CompileMode.OFF and self.device != "cpu":
            raise ConfigError("--torch-compile is a CPU option; CUDA steps replay CUDA graphs (--cuda-graphs) instead")


def parse_byte_size(text: str) -> int:
    """Parses `1073741824`, `512MiB`, `2GiB` or `1GB` (binary and decimal units) into bytes."""
    match = _SIZE_PATTERN.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(f"invalid size {text!r}; expected a number with an optional unit such as 512MiB or 2GB")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_quantized_dense_memory(text: str) -> int | None:
    """Bytes for dense copies of quantized weights; `auto` is None (the shard decides from the CPU and its memory)."""
    return None if text.strip() == "auto" else parse_byte_size(text)


def parse_batch_sizes(text: str, flag: str) -> tuple[int, ...]:
    """Sorted distinct positive sizes from `1,2,4`; `0` or empty is none."""
    if text.strip() in ("", "0"):
        return ()
    try:
        sizes = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated batch sizes such as 1,2,4,8 or 0, got {text!r}") from None
    if sizes[0] < 1:
        raise ConfigError(f"{flag} batch sizes must be positive, got {text!r}")
    return tuple(sizes)


def resolve_dtype(name: str) -> torch.dtype:
    """A dtype named by `--dtype`; `auto` is the shard's choice (weight_defaults.py)."""
    return _named_dtype(name, "dtype")


def resolve_kv_cache_dtype(name: str) -> torch.dtype | None:
    """`auto` (None) keeps the KV cache in the model's dtype."""
    return None if name == "auto" else _named_dtype(name, "KV cache dtype")


def _named_dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"unknown {what} {name!r}; choose auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The flag spelling of a torch dtype (`torch.bfloat16` -> `bfloat16`)."""
    return str(dtype).removeprefix("torch.")
