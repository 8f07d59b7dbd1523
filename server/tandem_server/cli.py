"""`tandem-shard`: parse flags into a ShardConfig, load the model, then serve the shard contract."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from tandem_server.bootstrap import LoadedShard, load_shard
from tandem_server.compile_default import AUTO as COMPILE_AUTO
from tandem_server.compile_default import CHOICES as COMPILE_CHOICES
from tandem_server.compile_default import choose_compile_mode, cpp_compiler
from tandem_server.config import (
    ATTENTION_BACKENDS,
    DEFAULT_COMPILE_CACHE_DIR,
    DEVICES,
    DTYPES,
    CompileMode,
    ShardConfig,
    parse_byte_size,
    resolve_kv_cache_dtype,
)
from tandem_server.device_defaults import choose_device_settings
from tandem_server.distributed import shutdown_distributed
from tandem_server.errors import ConfigError
from tandem_server.execution.kv_offload import KvOffloadOptions
from tandem_server.faults import FaultPlan, FaultTarget, inject_faults
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY
from tandem_server.kv_cache_default import AUTO as KV_AUTO
from tandem_server.kv_cache_default import AUTO_KV_MAX_BYTES, AUTO_KV_TOKENS, parse_kv_cache_memory
from tandem_server.metrics import ShardMetrics
from tandem_server.quant.mode import QuantizeMode
from tandem_server.rpc.cluster_auth import read_cluster_secret
from tandem_server.rpc.model_thread import ModelThread
from tandem_server.rpc.server import TcpListener, serve_until_signalled
from tandem_server.rpc.servicer import ShardServicer
from tandem_server.telemetry import add_tracing_flags, start_tracing, tracing_config
from tandem_server.vision.encoder_cache import DEFAULT_ENCODER_CACHE_BYTES
from tandem_server.weight_defaults import AUTO, choose_weight_settings, cpu_multiplies_bfloat16

logger = logging.getLogger("tandem_server")

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    """The shard's flags; the launcher passes every one explicitly."""
    parser = argparse.ArgumentParser(prog="tandem-shard", description="Tandem model shard (one per device)")
    parser.add_argument("--model-path", type=Path, required=True, help="directory with config.json and *.safetensors")
    parser.add_argument("--uds-path", type=Path, required=True, help="Unix socket to serve gRPC on")
    parser.add_argument(
        "--draft-model-path",
        type=Path,
        default=None,
        help="speculative decoding: a directory with a smaller model of the same vocabulary that proposes drafts",
    )
    _add_cluster_flags(parser)
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--dtype", choices=("auto", *DTYPES), default="auto")
    parser.add_argument(
        "--kv-cache-dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="dtype of the KV cache, in which attention computes; auto: the model's dtype (other dtypes need the "
        f"{' or '.join(ATTENTION_REGISTRY.names_with(lambda capabilities: capabilities.other_kv_cache_dtype))} "
        "attention backend)",
    )
    parser.add_argument(
        "--kv-cache-memory",
        default=KV_AUTO,
        help="CPU: KV cache budget, e.g. 512MiB, 2GiB, 1GB; auto (default): room for "
        f"{AUTO_KV_TOKENS} tokens of the model, at most {AUTO_KV_MAX_BYTES >> 30}GiB and a quarter of the memory "
        "available after loading (split between ranks)",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (default: cpus / world size)")
    parser.add_argument(
        "--attention-backend",
        default="auto",
        help=f"one of: {', '.join(ATTENTION_BACKENDS)}; auto: {ATTENTION_REGISTRY.describe_auto()}",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block the router pages with (the launcher passes its own); auto takes flash-attn-4 only "
        "at its TMA page size",
    )
    parser.add_argument(
        "--cuda-memory-fraction", type=float, default=0.9, help="CUDA: share of free device memory for the KV cache"
    )
    parser.add_argument(
        "--cuda-graphs",
        default=AUTO,
        help="CUDA: batch sizes whose decode (and draft-verifying) steps are captured as graphs, e.g. 1,2,4,8; 0 "
        "disables; auto (default): 1,2,...,64 on CUDA, none on CPU",
    )
    _add_cpu_weight_flags(parser)
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port; 0: off")
    parser.add_argument("--metrics-hostname", default="127.0.0.1", help="address the metrics endpoint binds")
    parser.add_argument(
        "--allow-pickle-weights",
        action="store_true",
        help="load *.bin/*.pt weights when the model has no safetensors (unpickling untrusted files is unsafe)",
    )
    parser.add_argument(
        "--expert-parallel",
        action="store_true",
        help="each shard holds whole routed experts (a contiguous share) instead of a slice of every expert",
    )
    parser.add_argument(
        "--encoder-cache-memory",
        default=f"{DEFAULT_ENCODER_CACHE_BYTES >> 20}MiB",
        help="vision-language models: memory for the embeddings of recent images, so a repeated image skips the "
        "encoder, e.g. 512MiB; 0: encode every image",
    )
    parser.add_argument(
        "--kv-offload-memory",
        default="0",
        help="host memory for KV blocks the router evicts, so a prefix hit loads them back instead of recomputing "
        "them, e.g. 8GiB; 0 (default): off",
    )
    parser.add_argument(
        "--kv-offload-dir",
        type=Path,
        default=None,
        help="a directory for a disk tier behind the host one (each rank writes under rank-N/)",
    )
    parser.add_argument(
        "--kv-offload-disk",
        default="16GiB",
        help="the disk tier's size under --kv-offload-dir (default 16GiB)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=None,
        help="seconds one model job may run before Health reports the shard stalled (default: never)",
    )
    _add_lora_flags(parser)
    _add_fault_flags(parser)
    add_tracing_flags(parser)
    return parser


def _add_lora_flags(parser: argparse.ArgumentParser) -> None:
    lora = parser.add_argument_group("LoRA adapters")
    lora.add_argument(
        "--lora-adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="load the PEFT LoRA adapter in local directory PATH as NAME before serving (repeatable)",
    )
    lora.add_argument(
        "--max-loras", type=int, default=4, help="most distinct LoRA adapters one step runs (0: serve no adapters)"
    )
    lora.add_argument("--max-lora-rank", type=int, default=64, help="highest LoRA adapter rank the shard accepts")
    lora.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="most LoRA adapters whose weights stay in memory (at least --max-loras); the least recently used others "
        "are read again from their directories when a request names them; default: --max-loras or the number of "
        "--lora-adapter, whichever is larger",
    )


def lora_adapter_flags(values: Sequence[str]) -> tuple[tuple[str, Path], ...]:
    """`--lora-adapter NAME=PATH` values as (name, directory) pairs, in the order given."""
    pairs = []
    for value in values:
        name, equals, path = value.partition("=")
        if not equals or not name or not path:
            raise ConfigError(f"--lora-adapter {value!r}: expected NAME=PATH (a name and a local directory)")
        pairs.append((name, Path(path).expanduser()))
    return tuple(pairs)


def _add_cpu_weight_flags(parser: argparse.ArgumentParser) -> None:
    """How GEMM weights are stored and copied, and the CPU's decode mirror."""
    parser.add_argument(
        "--packed-gemm-rows",
        default=AUTO,
        help="CPU: GEMM row counts (decode batch sizes) that get prepacked weights, e.g. 32 or 16,32 (float32: one "
        "MKL copy per count; bfloat16: one oneDNN copy for any batch up to 256 rows); 0 disables; auto (default): 32 "
        "on CPU, none on CUDA",
    )
    parser.add_argument(
        "--quantize",
        choices=[AUTO, *(mode.value for mode in QuantizeMode)],
        default=AUTO,
        help="GEMM weights: auto (default): gguf for a GGUF model on CPU, else none; gguf, int8, int4 (CPU): GGUF "
        "blocks or float weights quantized at load; fp8 (CPU, CUDA sm89+): float8 e4m3 at load; none: float. FP8 "
        "checkpoints stay float8 with auto, none or fp8",
    )
    parser.add_argument(
        "--decode-mirror-memory",
        default=AUTO,
        help="CPU: memory for contiguous copies of decoding requests' keys and values, read by decode attention "
        "instead of gathering cache blocks every step, e.g. 1GiB; 0 disables; auto (default): half of the KV cache "
        "on CPU, 0 on CUDA",
    )
    parser.add_argument(
        "--quantized-dense-memory",
        default=AUTO,
        help="CPU, quantized weights: memory for bfloat16 copies of them, which batches of 6 or more rows multiply "
        "by instead, e.g. 1GiB; auto (default): half the available memory, split between ranks, where the CPU has "
        "bfloat16 matrix instructions (AMX or AVX-512 BF16), else none; 0: none",
    )
    parser.add_argument(
        "--torch-compile",
        nargs="?",
        const=CompileMode.WARMUP.value,
        default=COMPILE_AUTO,
        choices=COMPILE_CHOICES,
        help="CPU: compile the forward pass of decode steps on the decode mirror into one graph (Inductor). "
        "background: a single stream's decode steps run a graph compiled ahead of time in a child process and kept "
        "in --compile-cache-dir (on several ranks: compiled on a thread beside serving), taking over once ready; "
        "warmup (the flag alone): the graphs of every row count and each decoder layer's stages compile before the "
        "shard is ready; off: every step eager; auto (default): background on CPU where a C++ compiler is found, "
        "else off",
    )
    parser.add_argument(
        "--compile-cache-dir",
        type=Path,
        default=DEFAULT_COMPILE_CACHE_DIR,
        help="where --torch-compile background keeps its compiled decode graphs across restarts",
    )


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """This rank's place in the tensor-parallel group and how it meets the others."""
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--local-rank", type=int, default=None, help="rank on this node (its GPU); default: --rank")
    parser.add_argument(
        "--rendezvous-timeout",
        type=float,
        default=600.0,
        help="seconds every rank may take to arrive before start-up fails naming the missing ranks",
    )
    parser.add_argument("--grpc-port", type=int, default=0, help="also serve gRPC on this TCP port; 0: off")
    parser.add_argument("--grpc-host", default="127.0.0.1", help="address the TCP gRPC port binds")
    parser.add_argument(
        "--cluster-secret-file", type=Path, default=None, help="file with the secret TCP callers must present"
    )


def _add_fault_flags(parser: argparse.ArgumentParser) -> None:
    testing = parser.add_argument_group("fault injection (tests only; off by default)")
    testing.add_argument(
        "--fault-inject-step-error",
        metavar="RANK:STEP",
        help="rank RANK raises instead of running its STEP-th forward-pass Step (counted from 1 since start-up)",
    )
    testing.add_argument(
        "--fault-inject-step-hang",
        metavar="RANK:STEP",
        help="rank RANK never returns from its STEP-th forward-pass Step (nor answers any later Step or Reset)",
    )


def _fault_plan(args: argparse.Namespace) -> FaultPlan:
    error, hang = args.fault_inject_step_error, args.fault_inject_step_hang
    return FaultPlan(
        step_error=FaultTarget.parse(error, "--fault-inject-step-error") if error is not None else None,
        step_hang=FaultTarget.parse(hang, "--fault-inject-step-hang") if hang is not None else None,
    )


def config_from_args(argv: Sequence[str] | None = None) -> ShardConfig:
    """Parses and validates the command line into a frozen ShardConfig."""
    args = build_parser().parse_args(argv)
    world_size = max(1, args.world_size)
    default_threads = max(1, (os.cpu_count() or 1) // world_size)
    kv_cache_memory = parse_kv_cache_memory(args.kv_cache_memory)
    weights = choose_weight_settings(
        args.quantize,
        args.dtype,
        args.quantized_dense_memory,
        args.device,
        args.model_path,
        cpu_multiplies_bfloat16(),
    )
    devices = choose_device_settings(
        args.cuda_graphs, args.packed_gemm_rows, args.decode_mirror_memory, args.device, kv_cache_memory
    )
    compiler = cpp_compiler()
    compile_mode, compile_reason = choose_compile_mode(args.torch_compile, args.device, compiler)
    return ShardConfig(
        model_path=args.model_path,
        uds_path=args.uds_path,
        draft_model_path=args.draft_model_path,
        rank=args.rank,
        world_size=args.world_size,
        master_addr=args.master_addr,
        master_port=args.master_port,
        local_rank=args.local_rank,
        rendezvous_timeout_s=args.rendezvous_timeout,
        grpc_port=args.grpc_port,
        grpc_host=args.grpc_host,
        cluster_secret_file=args.cluster_secret_file,
        device=args.device,
        dtype=weights.dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(args.kv_cache_dtype),
        kv_cache_memory=kv_cache_memory,
        num_threads=args.num_threads if args.num_threads is not None else default_threads,
        attention_backend=args.attention_backend,
        block_size=args.block_size,
        cuda_memory_fraction=args.cuda_memory_fraction,
        cuda_graph_sizes=devices.cuda_graph_sizes,
        packed_gemm_rows=devices.packed_gemm_rows,
        quantize=weights.quantize,
        decode_mirror_memory=devices.decode_mirror_memory,
        quantized_dense_memory=weights.quantized_dense_memory,
        auto_reasons=(*weights.reasons, *devices.reasons, compile_reason),
        torch_compile=compile_mode,
        cpp_compiler=compiler,
        compile_cache_dir=args.compile_cache_dir.expanduser(),
        log_level=args.log_level,
        metrics_port=args.metrics_port,
        metrics_hostname=args.metrics_hostname,
        allow_pickle_weights=args.allow_pickle_weights,
        expert_parallel=args.expert_parallel,
        step_timeout_s=args.step_timeout,
        lora_adapters=lora_adapter_flags(args.lora_adapter),
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        encoder_cache_memory=parse_byte_size(args.encoder_cache_memory),
        kv_offload=KvOffloadOptions(
            host_bytes=parse_byte_size(args.kv_offload_memory),
            disk_dir=args.kv_offload_dir / f"rank-{args.rank}" if args.kv_offload_dir is not None else None,
            disk_bytes=parse_byte_size(args.kv_offload_disk) if args.kv_offload_dir is not None else 0,
        ),
        faults=_fault_plan(args),
        tracing=tracing_config(args),
    )


def tcp_listener(config: ShardConfig) -> TcpListener | None:
    """The TCP port a router on another node calls, when --grpc-port is set."""
    if not config.grpc_port or config.cluster_secret_file is None:
        return None
    return TcpListener(config.grpc_host, config.grpc_port, read_cluster_secret(config.cluster_secret_file))


def load_on_model_thread(config: ShardConfig) -> tuple[ModelThread, LoadedShard]:
    """Starts the model thread and loads the shard on it.

    Every torch call that may run in parallel (loading, quantization, Warmup, Steps) runs on this one thread: each
    thread that enters a parallel region owns an OpenMP pool of its own, and with more pool threads than cores the
    pools' workers stop spinning between regions and sleep, which made a CPU decode step 1.6-2x slower. Loading on it
    also makes init_distributed bind this thread to the rank's CUDA device.
    """
    model_thread = ModelThread(config.step_timeout_s, overlap_steps=config.launches_ahead)
    try:
        return model_thread, model_thread.call(lambda: load_shard(config))
    except BaseException:
        model_thread.shut_down()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `tandem-shard`; returns the process exit code."""
    try:
        config = config_from_args(argv)
    except ConfigError as error:
        print(f"tandem-shard: error: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s shard[{config.rank}] %(name)s: %(message)s",
    )
    torch.set_num_threads(config.num_threads)
    try:
        tcp = tcp_listener(config)  # an unreadable secret fails before any weight loads
        model_thread, shard = load_on_model_thread(config)
        metrics = None
        if config.metrics_port:
            metrics = ShardMetrics(config.rank, shard.runner.device)
            metrics.watch_compilation(shard.runner.compilation)
            if shard.runner.expert_tokens:
                metrics.watch_expert_tokens(shard.runner.expert_tokens.read)
            if shard.runner.images is not None:
                metrics.watch_image_encoder(shard.runner.images.counts)
            metrics.serve(config.metrics_port, config.metrics_hostname)
        faulty = inject_faults(shard.runner, config.faults, config.rank)
        tracer = start_tracing(config.tracing, config.rank)
        servicer = ShardServicer(faulty or shard.runner, shard.info, metrics, model_thread, tracer)
        try:
            asyncio.run(serve_until_signalled(servicer, config.uds_path, tcp))
        finally:
            if faulty is not None:
                faulty.release()
    except ConfigError as error:
        logger.error("cannot start: %s", error)
        return 2
    finally:
        shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
