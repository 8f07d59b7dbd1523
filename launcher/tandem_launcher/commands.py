"""The explicit argv of each child: everything a shard or the router needs is a flag."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from tandem_launcher.cluster import worker_addresses
from tandem_launcher.config import LauncherConfig, bound_flags
from tandem_launcher.device_defaults import cuda_graph_sizes, decode_mirror_memory, packed_gemm_rows
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel

MASTER_ADDR = "127.0.0.1"
SHARD_CONNECT_TIMEOUT_S = 30


def free_tcp_port(host: str = MASTER_ADDR) -> int:
    """A port free right now, for the shards' torch.distributed rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def threads_per_shard(num_shard: int) -> int:
    """Shards split the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, cpus // num_shard)


def shard_argv(
    config: LauncherConfig,
    model: ResolvedModel,
    local_rank: int,
    uds_path: Path,
    master_port: int,
    inject_faults: bool = False,
) -> list[str]:
    """argv of this node's shard of `local_rank` (its global rank follows from the node's); the test-only fault
    flags only when `inject_faults`."""
    rank = config.layout.global_rank(local_rank)
    argv = [
        *config.commands.shard,
        "--model-path", str(model.path),
        "--uds-path", str(uds_path),
        "--rank", str(rank),
        "--local-rank", str(local_rank),
        "--world-size", str(config.num_shard),
        "--master-addr", MASTER_ADDR if config.nnodes == 1 else config.master_addr,
        "--master-port", str(master_port),
        "--rendezvous-timeout", str(config.rendezvous_timeout),
        "--device", config.device,
        "--dtype", config.dtype,
        "--kv-cache-memory", config.kv_cache_memory,
        "--kv-cache-dtype", config.kv_cache_dtype,
        "--num-threads", str(threads_per_shard(config.layout.local)),
        "--attention-backend", config.attention_backend,
        "--block-size", str(config.block_size),
        "--cuda-memory-fraction", str(config.cuda_memory_fraction),
        "--cuda-graphs", cuda_graph_sizes(config),
        "--packed-gemm-rows", packed_gemm_rows(config),
        "--quantize", config.quantize,
        "--decode-mirror-memory", decode_mirror_memory(config),
        "--quantized-dense-memory", config.quantized_dense_memory or "auto",
        "--step-timeout", str(config.step_timeout),
        "--log-level", config.log_level,
        "--metrics-port", str(config.shard_metrics_port + local_rank if config.shard_metrics_port else 0),
        "--metrics-hostname", config.hostname,
    ]  # fmt: skip
    if not config.is_leader and config.cluster_secret_file is not None:
        # A worker node's ranks also serve the leader's router over TCP, to callers with the secret.
        argv += [
            "--grpc-port", str(config.shard_grpc_port + local_rank),
            "--grpc-host", config.hostname,
            "--cluster-secret-file", str(config.cluster_secret_file),
        ]  # fmt: skip
    if model.draft_path is not None:
        argv += ["--draft-model-path", str(model.draft_path)]
    if config.allow_pickle_weights:
        argv.append("--allow-pickle-weights")
    if config.torch_compile:
        argv.append("--torch-compile")
    if inject_faults and config.fault_inject_step_error is not None:
        argv += ["--fault-inject-step-error", config.fault_inject_step_error]
    if inject_faults and config.fault_inject_step_hang is not None:
        argv += ["--fault-inject-step-hang", config.fault_inject_step_hang]
    return argv


def router_argv(
    config: LauncherConfig,
    model: ResolvedModel,
    limits: TokenLimits,
    uds_paths: list[Path],
    key_file: Path | None = None,
    launch_id_file: Path | None = None,
) -> list[str]:
    """argv of the router; shard sockets are listed in rank order. API keys are never on it: `key_file` holds
    the `--api-key` values and the user's `--api-key-file`s are passed as they are. The router answers `/health`
    with the id in `launch_id_file`, so the launcher knows it talks to its own router."""
    argv = [*config.commands.router, "--hostname", config.hostname, "--port", str(config.port)]
    if launch_id_file is not None:
        argv += ["--launch-id-file", str(launch_id_file)]
    argv += shard_address_argv(config, uds_paths)
    argv += [
        "--tokenizer-path", str(model.path),
        "--model-id", model.served_name,
        "--max-concurrent-requests", str(config.max_concurrent_requests),
        "--max-input-tokens", str(limits.max_input_tokens),
        "--max-total-tokens", str(limits.max_total_tokens),
        "--max-batch-prefill-tokens", str(config.max_batch_prefill_tokens),
        "--max-batch-size", str(config.max_batch_size),
        "--block-size", str(config.block_size),
        "--prefix-caching", "true" if config.prefix_caching else "false",
        "--async-scheduling", "true" if config.async_scheduling else "false",
        "--speculate", str(config.speculate),
        "--speculative-method", config.speculative_method,
        "--speculative-disable-by-batch-size", str(config.speculative_disable_by_batch_size),
        "--shard-connect-timeout", str(SHARD_CONNECT_TIMEOUT_S),
        "--max-queue-time", str(math.ceil(config.max_queue_time)),
        "--graceful-termination-timeout", str(math.ceil(config.graceful_termination_timeout)),
        "--step-timeout", str(math.ceil(config.step_timeout)),
    ]  # fmt: skip
    argv += api_argv(config)
    argv += kv_events_argv(config)
    if config.max_queued_tokens is not None:
        argv += ["--max-queued-tokens", str(config.max_queued_tokens)]
    for path in (*([key_file] if key_file else []), *config.api_key_file):
        argv += ["--api-key-file", str(path)]
    if config.json_output:
        argv.append("--json-output")
    if config.log_requests:
        argv.append("--log-requests")
    return argv


def kv_events_argv(config: LauncherConfig) -> list[str]:
    """The router's KV-cache event flags; none while events are off."""
    if config.kv_events_endpoint is None:
        return []
    argv = [
        "--kv-events-endpoint", config.kv_events_endpoint,
        "--kv-events-topic", config.kv_events_topic,
        "--kv-events-hash-seed", config.kv_events_hash_seed,
    ]  # fmt: skip
    if config.kv_events_replay_endpoint is not None:
        argv += ["--kv-events-replay-endpoint", config.kv_events_replay_endpoint]
    return argv


def shard_address_argv(config: LauncherConfig, uds_paths: list[Path]) -> list[str]:
    """Where the router reaches every rank, in rank order: the leader's own sockets, then each worker node's TCP
    ports (with the cluster secret's file)."""
    if config.nnodes == 1:
        return [word for path in uds_paths for word in ("--shard-uds-path", str(path))]
    uris = [f"unix://{path}" for path in uds_paths]
    for host in worker_addresses(config.nnodes, config.worker_addr, config.master_addr):
        shown = f"[{host}]" if ":" in host else host
        uris += [f"http://{shown}:{config.shard_grpc_port + local}" for local in range(config.layout.local)]
    argv = [word for uri in uris for word in ("--shard-uri", uri)]
    if config.cluster_secret_file is not None:
        argv += ["--cluster-secret-file", str(config.cluster_secret_file)]
    return argv


def api_argv(config: LauncherConfig) -> list[str]:
    """The router's client-facing API limits and options."""
    argv = [
        "--max-stop-sequences", str(config.max_stop_sequences),
        "--max-top-n-tokens", str(config.max_top_n_tokens),
        "--max-best-of", str(config.max_best_of),
        "--max-client-batch-size", str(config.max_client_batch_size),
        "--payload-limit", str(config.payload_limit),
        "--generation-config", config.generation_config,
        "--responses-store-max-entries", str(config.responses_store_max_entries),
        "--responses-store-max-bytes", str(config.responses_store_max_bytes),
    ]  # fmt: skip
    for flag, value in {**bound_flags(config, positive=True), **bound_flags(config, positive=False)}.items():
        argv += [flag, str(value)]
    if config.chat_template is not None:
        argv += ["--chat-template", str(config.chat_template)]
    if config.always_include_usage:
        argv.append("--always-include-usage")
    if config.disable_chat_completions:
        argv.append("--disable-chat-completions")
    return argv


def probe_base_url(hostname: str, port: int) -> str:
    """A URL the launcher itself can reach the router at, also when it binds a wildcard address."""
    if hostname in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif hostname == "::":
        host = "[::1]"
    elif ":" in hostname:
        host = f"[{hostname}]"
    else:
        host = hostname
    return f"http://{host}:{port}"
