"""A stand-in for `tandem-shard`: accepts its flags, answers `Info` over the Unix socket, acts out a behaviour."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from forwarded_flags import add_forwarded_flags
from tandem_launcher.shard_flags import SHARD_FLAGS
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc

BEHAVIOURS = (
    "serve",
    "crash-after-ready",
    "crash-once",
    "freeze-after-ready",
    "fail-at-start",
    "never-ready",
    "ignore-sigterm",
)


def record(events: Path | None, text: str) -> None:
    if events is not None:
        with events.open("a") as handle:
            handle.write(text + "\n")


class InfoAndHealth(shard_pb2_grpc.ShardServiceServicer):
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    async def Info(self, request: shard_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> shard_pb2.InfoResponse:
        return shard_pb2.InfoResponse(architecture="Fake", rank=self.rank, world_size=self.world_size)

    async def Health(
        self, request: shard_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.HealthResponse:
        return shard_pb2.HealthResponse()


def crashes_now(args: argparse.Namespace) -> bool:
    """crash-after-ready crashes every time; crash-once only in the first process of its rank."""
    if args.behaviour == "crash-after-ready":
        return True
    if args.behaviour != "crash-once" or args.events is None:
        return False
    marker = args.events.with_name(f"crashed-once-{args.rank}")
    if marker.exists():
        return False
    marker.touch()
    return True


async def serve(args: argparse.Namespace) -> int:
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServiceServicer_to_server(InfoAndHealth(args.rank, args.world_size), server)
    server.add_insecure_port(f"unix://{args.uds_path}")
    await server.start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    print(f"fake shard {args.rank} ready at {args.uds_path}", flush=True)
    if args.grandchild:
        grandchild = subprocess.Popen(["sleep", "600"])
        record(args.events, f"grandchild-{args.rank} pid {grandchild.pid}")
    if args.behaviour == "freeze-after-ready":
        await asyncio.sleep(args.crash_delay)
        print(f"fake shard {args.rank}: freezing", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    if crashes_now(args):
        await asyncio.sleep(args.crash_delay)
        print(f"fake shard {args.rank}: device lost, aborting", flush=True)
        return 3
    await stopped.wait()
    record(args.events, f"shard-{args.rank} stopped")
    await server.stop(grace=None)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="serve")
    parser.add_argument("--events", type=Path)
    parser.add_argument("--crash-delay", type=float, default=0.5)
    parser.add_argument("--grandchild", action="store_true", help="start a `sleep` child, as a stray helper would")
    for flag in ("--model-path", "--uds-path", "--master-addr", "--device", "--log-level", "--metrics-hostname"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--step-timeout", required=True)
    parser.add_argument("--rendezvous-timeout", type=float, required=True)
    add_forwarded_flags(parser, SHARD_FLAGS)
    for flag in ("--grpc-port", "--grpc-host", "--cluster-secret-file"):
        parser.add_argument(flag)
    for flag in (
        "--rank",
        "--local-rank",
        "--world-size",
        "--master-port",
        "--num-threads",
        "--metrics-port",
        "--block-size",
    ):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--allow-pickle-weights", action="store_true")
    parser.add_argument("--draft-model-path")
    parser.add_argument("--lora-adapter", action="append", default=[])
    parser.add_argument("--fault-inject-step-error")
    parser.add_argument("--fault-inject-step-hang")
    args = parser.parse_args()
    record(args.events, f"shard-{args.rank} pid {os.getpid()} argv {' '.join(sys.argv[1:])}")
    record(args.events, f"shard-{args.rank} environment {' '.join(sorted(os.environ))}")
    if args.behaviour == "fail-at-start":
        print("loading weights", flush=True)
        print("error: config.json names an unsupported architecture", flush=True)
        return 2
    if args.behaviour == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.behaviour in ("never-ready", "ignore-sigterm"):
        print("still loading ...", flush=True)
        while True:
            time.sleep(1)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
