"""Multi-node shard groups: this node's place in the group, its flags, and where the leader finds each rank.

Node 0 (the leader) runs the router and ranks 0..local-1 on Unix sockets; node n runs ranks n*local..(n+1)*local-1,
each listening on TCP at `--shard-grpc-port` + its local rank, guarded by the cluster secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tandem_launcher.flags import FlagAdder

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
DEFAULT_SHARD_GRPC_PORT = 50051
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
# LeaderWorkerSet's injected environment, read when the flags and their own variables are absent.
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"


@dataclass(frozen=True)
class NodeLayout:
    """Which global ranks this node runs: `local` ranks starting at `first_rank`."""

    node_rank: int
    local: int

    @property
    def first_rank(self) -> int:
        return self.node_rank * self.local

    def global_rank(self, local_rank: int) -> int:
        return self.first_rank + local_rank


def add_cluster_flags(add: FlagAdder, environ: Mapping[str, str]) -> None:
    """The multi-node flags; LWS's variables are their defaults when present."""
    add.value("--nnodes", int, environ.get(LWS_GROUP_SIZE, 1), f"nodes in the shard group ({LWS_GROUP_SIZE} if set)")
    add.value(
        "--node-rank", int, environ.get(LWS_WORKER_INDEX, 0), f"this node's index; 0 is the leader ({LWS_WORKER_INDEX})"
    )
    add.value(
        "--master-addr",
        str,
        environ.get(LWS_LEADER_ADDRESS, DEFAULT_MASTER_ADDR),
        f"the leader's address, where the ranks meet ({LWS_LEADER_ADDRESS} if set); used when --nnodes > 1",
    )
    add.value("--master-port", int, DEFAULT_MASTER_PORT, "TCP port of the ranks' rendezvous on the leader")
    add.value(
        "--shard-grpc-port",
        int,
        DEFAULT_SHARD_GRPC_PORT,
        "a worker node's shard of local rank r serves gRPC on this port + r, at --hostname",
    )
    add.value(
        "--cluster-secret-file",
        Path,
        None,
        "a file holding the secret the router presents to remote shards (needed when --nnodes > 1)",
    )
    add.repeated(
        "--worker-addr",
        str,
        "address of worker node n (n = 1, 2, ... in order), where the leader's router reaches its shards; "
        f"unset: derived from {LWS_LEADER_ADDRESS} as LeaderWorkerSet names its pods",
    )
    add.value(
        "--rendezvous-timeout",
        float,
        DEFAULT_RENDEZVOUS_TIMEOUT_S,
        "seconds every rank may take to arrive at the rendezvous before start-up fails naming the missing ones",
    )


def lws_worker_address(leader_address: str, node_rank: int) -> str:
    """LeaderWorkerSet names the leader `<set>-<group>` and worker n `<set>-<group>-<n>` under the same subdomain."""
    first, dot, rest = leader_address.partition(".")
    return f"{first}-{node_rank}{dot}{rest}"


def worker_addresses(nnodes: int, given: tuple[str, ...], master_addr: str) -> tuple[str, ...]:
    """Worker node addresses in node order: the given ones, else LWS's names derived from the leader's."""
    if given:
        return given
    return tuple(lws_worker_address(master_addr, node) for node in range(1, nnodes))


def cluster_problems(
    *, num_shard: int, nnodes: int, node_rank: int, ports: Mapping[str, int], secret_file: Path | None
) -> list[str]:
    """Why the multi-node flags do not describe a group, one message per problem."""
    problems = []
    if nnodes < 1:
        return [f"--nnodes must be positive, got {nnodes}"]
    if not 0 <= node_rank < nnodes:
        problems.append(f"--node-rank must be in 0..{nnodes - 1} for --nnodes {nnodes}, got {node_rank}")
    if num_shard % nnodes != 0:
        problems.append(
            f"--num-shard {num_shard} (ranks across all nodes) must be a multiple of --nnodes {nnodes}: "
            "every node runs the same number of ranks"
        )
    problems += [f"{flag} must be in 1..65535, got {port}" for flag, port in ports.items() if not 0 < port < 65536]
    if nnodes > 1 and secret_file is None:
        problems.append("--nnodes > 1 needs --cluster-secret-file: remote shards accept only authenticated calls")
    if secret_file is not None and not secret_file.is_file():
        problems.append(f"--cluster-secret-file {secret_file} is not a readable file")
    return problems
