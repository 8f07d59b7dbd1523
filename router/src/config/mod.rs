//! The checked configuration the router runs with, built from its command-line flags
//! (`args`).

mod args;
mod derived;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

pub use args::{ApiArgs, ApiKey, GenerationConfigUse, RouterArgs};
pub use derived::ServedModel;

use crate::http::ResponseStoreLimits;
use crate::images::MediaFetchConfig;
use crate::kv::events::KvEventsConfig;
use crate::limits::{ConnectionLimits, RequestLimits};
use crate::reasoning::ReasoningParserFlag;
use crate::scheduler::{DraftMethod, SchedulingPolicy};
use crate::shard::ShardAddress;
use crate::tools::ToolCallParser;

/// `--payload-limit`'s default for a model that reads text only (TGI's).
pub const TEXT_PAYLOAD_LIMIT: usize = 2_000_000;

/// Flags that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    #[error("--max-input-tokens ({max_input_tokens}) must be less than --max-total-tokens ({max_total_tokens})")]
    InputNotBelowTotal {
        max_input_tokens: usize,
        max_total_tokens: usize,
    },
    #[error(
        "--speculative-method radix drafts from the prefix cache: it needs --prefix-caching true"
    )]
    RadixDraftsWithoutPrefixCache,
    #[error("--model-id must not be empty")]
    EmptyModelId,
    #[error("--max-queued-tokens ({max_queued_tokens}) must be at least --max-total-tokens ({max_total_tokens}), or no request could ever be queued")]
    QueuedTokensBelowTotal {
        max_queued_tokens: usize,
        max_total_tokens: usize,
    },
}

/// Token limits and batch sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_concurrent_requests: usize,
    pub max_queued_tokens: Option<usize>,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_batch_prefill_tokens: usize,
    pub max_batch_size: usize,
    pub block_size: usize,
    pub prefix_caching: bool,
    pub max_state_checkpoints: usize,
    /// A positive multiple of `block_size`.
    pub state_checkpoint_interval: usize,
    pub async_scheduling: bool,
    pub speculate: usize,
    pub speculative_method: DraftMethod,
    pub speculative_disable_by_batch_size: usize,
    pub scheduling_policy: SchedulingPolicy,
}

/// The checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    pub hostname: String,
    pub port: u16,
    /// Every rank's address, in rank order.
    pub shard_addresses: Vec<ShardAddress>,
    pub cluster_secret_file: Option<PathBuf>,
    pub tokenizer_path: PathBuf,
    pub model_id: String,
    pub limits: Limits,
    pub json_output: bool,
    pub shard_connect_timeout: Duration,
    pub lifecycle: Lifecycle,
    pub api: ApiConfig,
    pub request_limits: RequestLimits,
    pub connections: ConnectionLimits,
    pub api_keys: Vec<ApiKey>,
    pub api_key_files: Vec<PathBuf>,
    pub launch_id_file: Option<PathBuf>,
    pub kv_events: KvEventsConfig,
    /// Which images may be fetched by URL.
    pub media_fetch: MediaFetchConfig,
}

/// The client-facing API's limits and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_best_of: usize,
    pub max_client_batch_size: usize,
    pub payload_limit: usize,
    /// Whether `--payload-limit` set `payload_limit`; otherwise it may grow for images.
    pub payload_limit_is_explicit: bool,
    pub always_include_usage: bool,
    pub chat_template: Option<PathBuf>,
    /// `--tool-call-parser`; `None`: the syntax the chat template writes.
    pub tool_call_parser: Option<ToolCallParser>,
    pub chat_completions: bool,
    /// Whether `generation_config.json`'s sampling values are OpenAI requests' defaults.
    pub model_sampling_defaults: bool,
    /// What `/v1/responses` may keep for `previous_response_id`.
    pub responses_store: ResponseStoreLimits,
    /// How chat output splits into reasoning and answer (`auto`: from the model).
    pub reasoning_parser: ReasoningParserFlag,
    /// Whether LoRA adapters may be loaded and unloaded while serving.
    pub runtime_lora_updates: bool,
}

/// How the router rides through shard restarts and shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// How long a request waits in the queue (also for restarting shards).
    pub max_queue_time: Duration,
    /// How long one Step (or a deep health probe) may take before the shards count as dead.
    pub step_timeout: Duration,
    /// How long in-flight requests may drain after SIGTERM.
    pub graceful_termination_timeout: Duration,
    /// Whether prompts and outputs are logged.
    pub log_requests: bool,
}

/// Every size flag that must be at least 1 is.
fn check_nonzero(args: &RouterArgs) -> Result<(), ConfigError> {
    let sizes = [
        ("max-concurrent-requests", args.max_concurrent_requests),
        ("max-input-tokens", args.max_input_tokens),
        ("max-total-tokens", args.max_total_tokens),
        ("max-batch-prefill-tokens", args.max_batch_prefill_tokens),
        ("max-batch-size", args.max_batch_size),
        ("block-size", args.block_size),
        ("max-best-of", args.api.max_best_of),
        ("max-client-batch-size", args.api.max_client_batch_size),
        ("payload-limit", args.api.payload_limit.unwrap_or(1)),
        ("max-queued-tokens", args.max_queued_tokens.unwrap_or(1)),
        (
            "max-queue-time",
            usize::try_from(args.max_queue_time).unwrap_or(usize::MAX),
        ),
        (
            "step-timeout",
            usize::try_from(args.step_timeout).unwrap_or(usize::MAX),
        ),
    ];
    if let Some((flag, _)) = sizes.iter().find(|(_, value)| *value == 0) {
        return Err(ConfigError::Zero(flag));
    }
    match args
        .request_limits
        .zero_flag()
        .or_else(|| args.connections.zero_flag())
    {
        Some(flag) => Err(ConfigError::Zero(flag)),
        None => Ok(()),
    }
}

/// The ranks' addresses: `--shard-uri`s, or `--shard-uds-path`s as Unix addresses (clap
/// allows only one of the two).
fn shard_addresses(uds_paths: Vec<PathBuf>, uris: Vec<ShardAddress>) -> Vec<ShardAddress> {
    match uris.is_empty() {
        true => uds_paths.into_iter().map(ShardAddress::Unix).collect(),
        false => uris,
    }
}

impl TryFrom<RouterArgs> for RouterConfig {
    type Error = ConfigError;

    fn try_from(args: RouterArgs) -> Result<Self, ConfigError> {
        check_consistent(&args)?;
        Ok(Self {
            hostname: args.hostname,
            port: args.port,
            shard_addresses: shard_addresses(args.shard_uds_paths, args.shard_uris),
            cluster_secret_file: args.cluster_secret_file,
            tokenizer_path: args.tokenizer_path,
            model_id: args.model_id,
            limits: Limits {
                max_concurrent_requests: args.max_concurrent_requests,
                max_queued_tokens: args.max_queued_tokens,
                max_input_tokens: args.max_input_tokens,
                max_total_tokens: args.max_total_tokens,
                max_batch_prefill_tokens: args.max_batch_prefill_tokens,
                max_batch_size: args.max_batch_size,
                block_size: args.block_size,
                prefix_caching: args.prefix_caching,
                max_state_checkpoints: args.max_state_checkpoints,
                state_checkpoint_interval: whole_blocks(
                    args.state_checkpoint_interval,
                    args.block_size,
                ),
                async_scheduling: args.async_scheduling,
                speculate: args.speculate,
                speculative_method: args.speculative_method,
                scheduling_policy: args.scheduling_policy,
                speculative_disable_by_batch_size: args.speculative_disable_by_batch_size,
            },
            json_output: args.json_output,
            shard_connect_timeout: Duration::from_secs(args.shard_connect_timeout),
            lifecycle: Lifecycle {
                max_queue_time: Duration::from_secs(args.max_queue_time),
                step_timeout: Duration::from_secs(args.step_timeout),
                graceful_termination_timeout: Duration::from_secs(
                    args.graceful_termination_timeout,
                ),
                log_requests: args.log_requests,
            },
            api: ApiConfig {
                max_stop_sequences: args.api.max_stop_sequences,
                max_top_n_tokens: args.api.max_top_n_tokens,
                max_best_of: args.api.max_best_of,
                max_client_batch_size: args.api.max_client_batch_size,
                payload_limit: args.api.payload_limit.unwrap_or(TEXT_PAYLOAD_LIMIT),
                payload_limit_is_explicit: args.api.payload_limit.is_some(),
                always_include_usage: args.api.always_include_usage,
                chat_template: args.api.chat_template,
                tool_call_parser: args.api.tool_call_parser,
                chat_completions: !args.api.disable_chat_completions,
                model_sampling_defaults: args.api.generation_config == GenerationConfigUse::Auto,
                responses_store: args.api.responses_store,
                reasoning_parser: args.api.reasoning_parser,
                runtime_lora_updates: args.api.allow_runtime_lora_updating,
            },
            request_limits: args.request_limits,
            connections: args.connections,
            api_keys: args.api_keys,
            api_key_files: args.api_key_files,
            launch_id_file: args.launch_id_file,
            kv_events: args.kv_events,
            media_fetch: args.media_fetch,
        })
    }
}

/// `tokens` rounded up to whole blocks of `block_size`, at least one.
fn whole_blocks(tokens: usize, block_size: usize) -> usize {
    tokens.max(1).next_multiple_of(block_size.max(1))
}

/// The flags that must agree with each other.
fn check_consistent(args: &RouterArgs) -> Result<(), ConfigError> {
    check_nonzero(args)?;
    if args.max_input_tokens >= args.max_total_tokens {
        return Err(ConfigError::InputNotBelowTotal {
            max_input_tokens: args.max_input_tokens,
            max_total_tokens: args.max_total_tokens,
        });
    }
    if args.model_id.trim().is_empty() {
        return Err(ConfigError::EmptyModelId);
    }
    if args.speculate > 0 && args.speculative_method == DraftMethod::Radix && !args.prefix_caching {
        return Err(ConfigError::RadixDraftsWithoutPrefixCache);
    }
    if let Some(max_queued_tokens) = args.max_queued_tokens {
        if max_queued_tokens < args.max_total_tokens {
            return Err(ConfigError::QueuedTokensBelowTotal {
                max_queued_tokens,
                max_total_tokens: args.max_total_tokens,
            });
        }
    }
    Ok(())
}
