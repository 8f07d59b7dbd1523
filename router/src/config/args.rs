//! The router's command-line flags, each also read from an upper-case environment variable.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::http::ResponseStoreLimits;
use crate::images::MediaFetchConfig;
use crate::kv::events::KvEventsConfig;
use crate::limits::{ConnectionLimits, RequestLimits};
use crate::reasoning::ReasoningParserFlag;
use crate::scheduler::{DraftMethod, SchedulingPolicy};
use crate::shard::ShardAddress;
use crate::telemetry::OtlpArgs;
use crate::tools::ToolCallParser;

/// Tandem's router: validates, tokenizes, schedules and streams for the model shards.
#[derive(Debug, Clone, Parser)]
#[command(name = "tandem-router", version, about)]
pub struct RouterArgs {
    /// Address to listen on. Its variable is `TANDEM_HOSTNAME`, not `HOSTNAME`: shells and
    /// Kubernetes set `HOSTNAME` to the machine or pod name.
    #[arg(long, env = "TANDEM_HOSTNAME", default_value = "127.0.0.1")]
    pub hostname: String,
    /// Port to listen on.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Unix socket of a shard; repeat once per rank, in rank order.
    #[arg(
        long = "shard-uds-path",
        env = "SHARD_UDS_PATH",
        value_delimiter = ',',
        required_unless_present = "shard_uris",
        conflicts_with = "shard_uris"
    )]
    pub shard_uds_paths: Vec<PathBuf>,
    /// A shard's address, `unix:///path` or `http://host:port` (a rank on another node);
    /// repeat once per rank, in rank order, instead of `--shard-uds-path`.
    #[arg(long = "shard-uri", env = "SHARD_URI", value_delimiter = ',')]
    pub shard_uris: Vec<ShardAddress>,
    /// A file holding the cluster secret, sent to every shard as `authorization: Bearer
    /// <secret>`; shards on other nodes refuse calls without it.
    #[arg(long, env = "CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Model directory holding tokenizer.json, tokenizer_config.json and optionally
    /// chat_template.jinja and generation_config.json.
    #[arg(long, env = "TOKENIZER_PATH")]
    pub tokenizer_path: PathBuf,
    /// Model name reported by the API.
    #[arg(long, env = "MODEL_ID")]
    pub model_id: String,
    /// Requests admitted at once, queued or running (each `n` choice and `best_of` candidate
    /// counts as one); more are answered 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 128)]
    pub max_concurrent_requests: usize,
    /// Tokens (prompt plus `max_new_tokens`, per choice) that admitted requests may hold
    /// until their first token; more are answered 429. Unset: only the request count bounds
    /// the queue.
    #[arg(long, env = "MAX_QUEUED_TOKENS")]
    pub max_queued_tokens: Option<usize>,
    /// Longest accepted prompt, in tokens.
    #[arg(long, env = "MAX_INPUT_TOKENS", default_value_t = 4095)]
    pub max_input_tokens: usize,
    /// Longest prompt plus generation, in tokens.
    #[arg(long, env = "MAX_TOTAL_TOKENS", default_value_t = 4096)]
    pub max_total_tokens: usize,
    /// Tokens one forward step may process (prompt chunks plus decode tokens).
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS", default_value_t = 512)]
    pub max_batch_prefill_tokens: usize,
    /// Requests one forward step may carry.
    #[arg(long, env = "MAX_BATCH_SIZE", default_value_t = 64)]
    pub max_batch_size: usize,
    /// Tokens per KV cache block.
    #[arg(long, env = "BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Share the KV blocks of a common token prefix between requests (`--prefix-caching false` turns it off).
    #[arg(long, env = "PREFIX_CACHING", default_value_t = true, action = clap::ArgAction::Set)]
    pub prefix_caching: bool,
    /// A model with recurrent state (a hybrid): the most state checkpoints the shards keep,
    /// each one sequence's recurrent state after a cached prefix, from which later requests
    /// resume; the shards keep fewer where they would take over a quarter of the KV cache's
    /// memory. 0 turns prefix caching off for such a model.
    #[arg(long, env = "MAX_STATE_CHECKPOINTS", default_value_t = 64)]
    pub max_state_checkpoints: usize,
    /// A model with recurrent state: tokens between state checkpoints within a long prompt
    /// (rounded up to whole KV blocks).
    #[arg(long, env = "STATE_CHECKPOINT_INTERVAL", default_value_t = 512)]
    pub state_checkpoint_interval: usize,
    /// Plan and send the next step while the shards run the current one (`--async-scheduling
    /// false` waits for each step's answer first).
    #[arg(long, env = "ASYNC_SCHEDULING", default_value_t = true, action = clap::ArgAction::Set)]
    pub async_scheduling: bool,
    /// Speculative decoding: up to this many draft tokens per decode step (see
    /// `--speculative-method`), kept by the shards only where they equal the request's own
    /// draws, so outputs never change. 0 turns it off.
    #[arg(long, env = "SPECULATE", default_value_t = 0)]
    pub speculate: usize,
    /// Where drafts come from: `ngram` looks the request's last tokens up in its own text;
    /// `radix` proposes what an earlier request computed after the same context (the prefix
    /// cache), falling back to `ngram` where the cache holds none; `draft` asks the shards' draft
    /// model for `--speculate` tokens (the router refuses to start if the shards run none).
    #[arg(long, env = "SPECULATIVE_METHOD", default_value_t = DraftMethod::Ngram)]
    pub speculative_method: DraftMethod,
    /// No step carries drafts while more requests than this run (vLLM's
    /// `speculative_disable_by_batch_size`): a large batch already keeps the shards busy.
    #[arg(long, env = "SPECULATIVE_DISABLE_BY_BATCH_SIZE", default_value_t = 4)]
    pub speculative_disable_by_batch_size: usize,
    /// The order requests are admitted, served and preempted in: `fcfs` by arrival; `priority`
    /// by each request's `priority` (lower first, then arrival), which requests may set only
    /// under this policy; `fair` by each API key's share of the tokens served, weighted by the
    /// key file's `weight=N`.
    #[arg(long, env = "SCHEDULING_POLICY", default_value_t = SchedulingPolicy::Fcfs)]
    pub scheduling_policy: SchedulingPolicy,
    /// Log as JSON lines.
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
    /// Seconds to wait for every shard socket to accept connections.
    #[arg(long, env = "SHARD_CONNECT_TIMEOUT", default_value_t = 60)]
    pub shard_connect_timeout: u64,
    /// Seconds a request may wait in the queue before it starts (also while the shards
    /// restart); then it fails with 503.
    #[arg(long, env = "MAX_QUEUE_TIME", default_value_t = 60)]
    pub max_queue_time: u64,
    /// Seconds the shards may take to answer one Step (and a deep health probe); past it
    /// the shard group counts as dead: in-flight requests fail and the router recovers.
    #[arg(long, env = "STEP_TIMEOUT", default_value_t = 120)]
    pub step_timeout: u64,
    /// An accepted API key; repeat or separate with commas. Prefer `--api-key-file`: argv
    /// is visible to every local user.
    #[arg(long = "api-key", env = "API_KEY", value_delimiter = ',')]
    pub api_keys: Vec<ApiKey>,
    /// A file of accepted API keys, one per line (`#` comments); read again on SIGHUP.
    #[arg(long = "api-key-file", env = "API_KEY_FILE")]
    pub api_key_files: Vec<PathBuf>,
    /// Seconds in-flight requests may take to finish after SIGTERM before the router exits.
    #[arg(long, env = "GRACEFUL_TERMINATION_TIMEOUT", default_value_t = 90)]
    pub graceful_termination_timeout: u64,
    /// Log every request body and response body (prompts and outputs); off by default.
    #[arg(long, env = "LOG_REQUESTS")]
    pub log_requests: bool,
    /// A file holding this launch's id, sent with every `/health` answer so the launcher
    /// knows the port is served by the router it started. Set by the launcher; no variable.
    #[arg(long)]
    pub launch_id_file: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub request_limits: RequestLimits,
    #[command(flatten)]
    pub connections: ConnectionLimits,
    #[command(flatten)]
    pub kv_events: KvEventsConfig,
    #[command(flatten)]
    pub media_fetch: MediaFetchConfig,
    #[command(flatten)]
    pub otlp: OtlpArgs,
}

/// Limits and behaviour of the client-facing API.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Most stop strings one request may carry.
    #[arg(long, env = "MAX_STOP_SEQUENCES", default_value_t = 4)]
    pub max_stop_sequences: usize,
    /// Most alternatives per token `top_n_tokens` may ask for on the native routes.
    #[arg(long, env = "MAX_TOP_N_TOKENS", default_value_t = 5)]
    pub max_top_n_tokens: u32,
    /// Most candidates `best_of` may ask for.
    #[arg(long, env = "MAX_BEST_OF", default_value_t = 2)]
    pub max_best_of: usize,
    /// Most prompts one `/v1/completions` request may list.
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 4)]
    pub max_client_batch_size: usize,
    /// Largest accepted request body, in bytes; larger ones are answered 413. Unset:
    /// 2,000,000, plus room for one base64 image of `--max-image-bytes` when the model reads
    /// images.
    #[arg(long, env = "PAYLOAD_LIMIT")]
    pub payload_limit: Option<usize>,
    /// End every OpenAI stream with a usage chunk, as if `stream_options.include_usage` were set.
    #[arg(long, env = "ALWAYS_INCLUDE_USAGE")]
    pub always_include_usage: bool,
    /// A Jinja chat template file used instead of the model's own.
    #[arg(long, env = "CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// The tool-call syntax (vLLM's parser names): hermes, llama3_json, mistral, deepseek_v31,
    /// deepseek_v32, kimi_k2, qwen3_coder, glm45, gemma4, openai, or tandem
    /// (Tandem's own, taught in a system message). Unset: the one the chat template writes.
    #[arg(long, env = "TOOL_CALL_PARSER", value_enum)]
    pub tool_call_parser: Option<ToolCallParser>,
    /// Serve no chat: /v1/chat/completions, /v1/messages and /v1/responses answer 400. A model
    /// without a chat template starts either way.
    #[arg(long, env = "DISABLE_CHAT_COMPLETIONS")]
    pub disable_chat_completions: bool,
    /// `auto`: OpenAI requests that leave temperature, top_p, top_k, min_p or
    /// repetition_penalty unset get the values the model's generation_config.json recommends
    /// (when it sets `do_sample: true`); `none`: they get the OpenAI defaults.
    #[arg(long, env = "GENERATION_CONFIG", value_enum, default_value_t = GenerationConfigUse::Auto)]
    pub generation_config: GenerationConfigUse,
    /// How chat output splits into reasoning and answer: `auto` reads the chat template's
    /// markers (`<think>`) and the model type, `deepseek_r1`, `qwen3`, `deepseek_v3`, `kimi_k2`,
    /// `glm45`, `gemma4` and `openai_gptoss` name a format (vLLM's names), `none` never splits.
    #[arg(long, env = "REASONING_PARSER", value_enum, default_value_t = ReasoningParserFlag::Auto)]
    pub reasoning_parser: ReasoningParserFlag,
    #[command(flatten)]
    pub responses_store: ResponseStoreLimits,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's routes), which
    /// change the shards' LoRA adapters while serving. Off: the adapters given at start-up.
    #[arg(long, env = "ALLOW_RUNTIME_LORA_UPDATING")]
    pub allow_runtime_lora_updating: bool,
}

/// Whether the model's recommended sampling values are OpenAI requests' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenerationConfigUse {
    Auto,
    None,
}

/// An API key as given on the command line; its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(pub String);

impl std::str::FromStr for ApiKey {
    type Err = std::convert::Infallible;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        Ok(Self(key.to_owned()))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ApiKey(<redacted>)")
    }
}
