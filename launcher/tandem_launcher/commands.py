"""The explicit argv of each child: everything a shard or the router needs is a flag."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from tandem_launcher.cluster import worker_addresses
from tandem_launcher.config import LauncherConfig
from tandem_launcher.forwarded import forwarded_argv
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel
from tandem_launcher.router_flags import ROUTER_FLAGS
from tandem_launcher.shard_flags import SHARD_FLAGS
from tandem_launcher.tracing_flags import router_tracing_argv, shard_tracing_argv

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
    """argv of this node's shard of `local_rank` (its global rank follows from the node's): the flags the launcher
    derives, then the forwarded ones (SHARD_FLAGS); the test-only fault flags only when `inject_faults`."""
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
        "--num-threads", str(threads_per_shard(config.layout.local)),
        "--block-size", str(config.block_size),
        "--step-timeout", str(config.step_timeout),
        "--log-level", config.log_level,
        "--metrics-port", str(config.shard_metrics_port + local_rank if config.shard_metrics_port else 0),
        "--metrics-hostname", config.hostname,
        *forwarded_argv(SHARD_FLAGS, config.forwarded),
        *shard_tracing_argv(config.otlp_endpoint, config.otlp_service_name),
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
    for name, path in model.lora_adapters:
        argv += ["--lora-adapter", f"{name}={path}"]
    if config.allow_pickle_weights:
        argv.append("--allow-pickle-weights")
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
    with the id in `launch_id_file`, so the launcher knows it talks to its own router. The flags the launcher
    derives come first, then the forwarded ones (ROUTER_FLAGS)."""
    argv = [*config.commands.router, "--hostname", config.hostname, "--port", str(config.port)]
    if launch_id_file is not None:
        argv += ["--launch-id-file", str(launch_id_file)]
    argv += shard_address_argv(config, uds_paths)
    argv += [
        "--tokenizer-path", str(model.path),
        "--model-id", model.served_name,
        "--max-input-tokens", str(limits.max_input_tokens),
        "--max-total-tokens", str(limits.max_total_tokens),
        "--block-size", str(config.block_size),
        "--speculate", str(config.speculate),
        "--speculative-method", config.speculative_method,
        "--speculative-disable-by-batch-size", str(config.speculative_disable_by_batch_size),
        "--shard-connect-timeout", str(SHARD_CONNECT_TIMEOUT_S),
        "--graceful-termination-timeout", str(math.ceil(config.graceful_termination_timeout)),
        "--step-timeout", str(math.ceil(config.step_timeout)),
        *forwarded_argv(ROUTER_FLAGS, config.forwarded),
        *router_tracing_argv(config.otlp_endpoint, config.otlp_sample_ratio, config.otlp_service_name),
    ]  # fmt: skip
    for path in (*([key_file] if key_file else []), *config.api_key_file):
        argv += ["--api-key-file", str(path)]
    if config.json_output:
        argv.append("--json-output")
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
