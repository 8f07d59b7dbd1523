"""The router's flags the launcher forwards as they are, one entry each (see `forwarded.py`); grouped as the
launcher's `--help` lists them. A new router flag is one entry here beside its clap definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem_launcher.flags import bool_value
from tandem_launcher.forwarded import (
    Child,
    Forwarded,
    expanded_path,
    not_negative,
    positive,
    switch,
    true_false,
    whole_seconds,
)

ROUTER = Child.ROUTER
# Whether the model's generation_config.json sets OpenAI requests' sampling defaults.
GENERATION_CONFIG_USES = ("auto", "none")
# vLLM's parser names for the tool-call syntaxes the router speaks, and Tandem's own.
TOOL_CALL_PARSERS = (
    "hermes",
    "llama3_json",
    "mistral",
    "deepseek_v31",
    "deepseek_v32",
    "kimi_k2",
    "qwen3_coder",
    "glm45",
    "gemma4",
    "openai",
    "tandem",
)
# How chat output splits into reasoning and answer (vLLM's parser names; auto: from the chat template's markers).
REASONING_PARSERS = (
    "auto",
    "none",
    "deepseek_r1",
    "qwen3",
    "deepseek_v3",
    "kimi_k2",
    "glm45",
    "gemma4",
    "openai_gptoss",
)


def _readable_file(flag: str, value: Any) -> str | None:
    if value is None or Path(value).is_file():
        return None
    return f"{flag} must be a readable file, got {str(value)!r}"


SCHEDULING_POLICIES = ("fcfs", "priority", "fair")

SCHEDULING = (
    Forwarded(
        "--max-concurrent-requests", ROUTER, int, 128,
        "requests queued or running (each n/best_of choice counts) before new ones get 429", check=positive,
    ),
    Forwarded(
        "--max-queued-tokens", ROUTER, int, None,
        "prompt + max new tokens that requests still waiting for their first token may hold before new ones get 429",
        check=positive,
    ),
    Forwarded(
        "--max-batch-prefill-tokens", ROUTER, int, 512,
        "tokens one forward pass may carry (longer prompts are chunked)", check=positive,
    ),
    Forwarded("--max-batch-size", ROUTER, int, 64, "requests one forward pass may carry", check=positive),
    Forwarded(
        "--prefix-caching", ROUTER, bool_value, True, "share the KV blocks of common prompt prefixes between requests",
        word=true_false,
    ),
    Forwarded(
        "--max-state-checkpoints", ROUTER, int, 64,
        "hybrid models: copies of one sequence's recurrent state after a cached prefix the shards keep at most, so "
        "requests resume after it (at most a quarter of the KV cache's memory; 0 turns prefix caching off for them)",
        check=not_negative,
    ),
    Forwarded(
        "--state-checkpoint-interval", ROUTER, int, 512,
        "hybrid models: prompt tokens between state checkpoints (rounded up to whole KV blocks)", check=positive,
    ),
    Forwarded(
        "--async-scheduling", ROUTER, bool_value, True,
        "plan and send the next step while the shards run the current one", word=true_false,
    ),
    Forwarded(
        "--scheduling-policy", ROUTER, str, "fcfs",
        "the order requests are admitted, served and preempted in: fcfs (arrival), priority (each request's "
        "priority, lower first, then arrival; requests may set a priority other than 0 only under this policy) or "
        "fair (weighted fair share of tokens per API key; weights from the key file, `KEY weight=N`)",
        choices=SCHEDULING_POLICIES,
    ),
)  # fmt: skip

# KV-cache events in vLLM's format for prefix-aware routers (docs/scaling.md); off unless an endpoint is set.
KV_EVENTS = (
    Forwarded(
        "--kv-events-endpoint", ROUTER, str, None,
        "ZMQ endpoint the router's event PUB socket binds, e.g. tcp://*:5557",
    ),
    Forwarded(
        "--kv-events-replay-endpoint", ROUTER, str, None,
        "ZMQ endpoint of the replay ROUTER socket, e.g. tcp://*:5558", only_with="kv_events_endpoint",
    ),
    Forwarded(
        "--kv-events-topic", ROUTER, str, "kv-events", "topic (first frame) of every published event batch",
        only_with="kv_events_endpoint",
    ),
    Forwarded(
        "--kv-events-hash-seed", ROUTER, str, "0",
        "seed of the block-hash chain: the consumers' PYTHONHASHSEED or hashSeed", only_with="kv_events_endpoint",
    ),
)  # fmt: skip

QUEUE = (
    Forwarded(
        "--max-queue-time", ROUTER, float, 60.0,
        "seconds a request may wait in the queue (also for restarting shards)", check=positive, word=whole_seconds,
    ),
)  # fmt: skip

# What one request may ask for, then the per-request and per-connection bounds (docs/security.md).
REQUEST_LIMITS = (
    Forwarded("--max-stop-sequences", ROUTER, int, 4, "most stop strings one request may carry", check=not_negative),
    Forwarded(
        "--max-top-n-tokens", ROUTER, int, 5, "most alternatives per token `top_n_tokens` may ask for",
        check=not_negative,
    ),
    Forwarded("--max-best-of", ROUTER, int, 2, "most candidates `best_of` may ask for", check=positive),
    Forwarded(
        "--max-client-batch-size", ROUTER, int, 4, "most prompts one /v1/completions request may list", check=positive
    ),
    Forwarded(
        "--payload-limit", ROUTER, int, None,
        "largest request body in bytes; larger ones get 413 (unset: 2,000,000, plus one base64 image of "
        "--max-image-bytes when the model reads images)",
        check=positive,
    ),
    Forwarded(
        "--max-stop-sequence-length", ROUTER, int, 512, "longest stop string, in bytes of UTF-8", check=positive
    ),
    Forwarded(
        "--max-stop-token-ids", ROUTER, int, 64, "most stop_token_ids one request may list", check=not_negative
    ),
    Forwarded(
        "--max-logit-bias", ROUTER, int, 300, "most logit_bias entries one request may carry", check=not_negative
    ),
    Forwarded("--max-tools", ROUTER, int, 128, "most tool definitions one chat request may carry", check=not_negative),
    Forwarded(
        "--max-grammar-bytes", ROUTER, int, 128 * 1024, "largest JSON schema, regex or tool grammar, in bytes",
        check=positive,
    ),
    Forwarded(
        "--max-choices", ROUTER, int, 16,
        "most generations one request may start: n (or best_of) times its prompts", check=positive,
    ),
    Forwarded(
        "--max-images-per-request", ROUTER, int, 8, "most images one request may carry (a text-only model takes none)",
        check=not_negative,
    ),
    Forwarded(
        "--max-image-bytes", ROUTER, int, 20 * 1024 * 1024, "largest image file, in bytes after base64 decoding",
        check=positive,
    ),
    Forwarded(
        "--max-image-pixels", ROUTER, int, 4096 * 4096,
        "most pixels (width times height) of one image, refused before it is decoded", check=positive,
    ),
    Forwarded(
        "--allowed-media-domains", ROUTER, str, None,
        "hosts whose http(s) image URLs are fetched, comma-separated exact names; unset: images come inline only",
    ),
    Forwarded(
        "--media-fetch-timeout", ROUTER, int, 10, "seconds one image fetch may take, connection and body together",
        check=positive,
    ),
    switch(
        "--allow-private-media-addresses", ROUTER,
        "allowed media hosts may resolve to private, loopback and link-local addresses (in-cluster media servers)",
    ),
    Forwarded(
        "--max-connections", ROUTER, int, 1024, "client connections open at once; more are closed at once",
        check=positive,
    ),
    Forwarded(
        "--header-read-timeout", ROUTER, int, 10,
        "seconds a client connection may take to send a request head (also how long an idle one stays open)",
        check=positive,
    ),
)  # fmt: skip

# Which OpenAI behaviours are on: usage chunks, chat templates, generation defaults, the responses store.
API = (
    switch("--always-include-usage", ROUTER, "end every OpenAI stream with a usage chunk"),
    Forwarded(
        "--chat-template", ROUTER, expanded_path, None, "a Jinja chat template file used instead of the model's own",
        check=_readable_file,
    ),
    switch("--disable-chat-completions", ROUTER, "serve no chat (the chat routes answer 400)"),
    switch(
        "--allow-runtime-lora-updating", ROUTER,
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes), which change the shards' LoRA "
        "adapters while serving",
    ),
    Forwarded(
        "--tool-call-parser", ROUTER, str, None,
        "the tool-call syntax: hermes (<tool_call>), llama3_json, mistral ([TOOL_CALLS]), deepseek_v31, deepseek_v32 "
        "(DSML), kimi_k2, "
        "qwen3_coder, glm45, gemma4 (<|tool_call>), openai (gpt-oss's harmony) or tandem (Tandem's own, taught in a "
        "system message); unset: the one the model's chat template writes",
        choices=TOOL_CALL_PARSERS,
    ),
    Forwarded(
        "--generation-config", ROUTER, str, "auto",
        "auto: OpenAI requests that leave temperature, top_p, top_k, min_p or repetition_penalty unset use the values "
        "the model's generation_config.json recommends (with do_sample: true); none: the OpenAI defaults",
        choices=GENERATION_CONFIG_USES,
    ),
    Forwarded(
        "--reasoning-parser", ROUTER, str, "auto",
        "how chat output splits into reasoning and answer: auto reads the chat template's <think> markers and the "
        "model type; deepseek_r1, qwen3, deepseek_v3, kimi_k2, glm45, gemma4 (<|channel>thought) and openai_gptoss "
        "(gpt-oss's harmony) name a format; none never splits",
        choices=REASONING_PARSERS,
    ),
    Forwarded(
        "--responses-store-max-entries", ROUTER, int, 1024,
        "most responses /v1/responses keeps for previous_response_id; past it the oldest is evicted (0: none)",
        check=not_negative,
    ),
    Forwarded(
        "--responses-store-max-bytes", ROUTER, int, 64 << 20,
        "most bytes the kept responses may take; past it the oldest are evicted", check=not_negative,
    ),
)  # fmt: skip

OBSERVABILITY = (switch("--log-requests", ROUTER, "log prompts and outputs (never logged otherwise)"),)

ROUTER_FLAGS = SCHEDULING + KV_EVENTS + QUEUE + REQUEST_LIMITS + API + OBSERVABILITY
