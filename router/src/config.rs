//! Command-line flags (each also read from an upper-case environment variable) and the
//! checked configuration the router runs with.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::limits::{ConnectionLimits, RequestLimits};

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
        required = true
    )]
    pub shard_uds_paths: Vec<PathBuf>,
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
    /// Largest accepted request body, in bytes; larger ones are answered 413.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,
    /// End every OpenAI stream with a usage chunk, as if `stream_options.include_usage` were set.
    #[arg(long, env = "ALWAYS_INCLUDE_USAGE")]
    pub always_include_usage: bool,
    /// A Jinja chat template file used instead of the model's own.
    #[arg(long, env = "CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Serve no chat completions: lets a model without a chat template start.
    #[arg(long, env = "DISABLE_CHAT_COMPLETIONS")]
    pub disable_chat_completions: bool,
    /// `auto`: OpenAI requests that leave temperature, top_p, top_k, min_p or
    /// repetition_penalty unset get the values the model's generation_config.json recommends
    /// (when it sets `do_sample: true`); `none`: they get the OpenAI defaults.
    #[arg(long, env = "GENERATION_CONFIG", value_enum, default_value_t = GenerationConfigUse::Auto)]
    pub generation_config: GenerationConfigUse,
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
}

/// The checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    pub hostname: String,
    pub port: u16,
    pub shard_uds_paths: Vec<PathBuf>,
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
}

/// The client-facing API's limits and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_best_of: usize,
    pub max_client_batch_size: usize,
    pub payload_limit: usize,
    pub always_include_usage: bool,
    pub chat_template: Option<PathBuf>,
    pub chat_completions: bool,
    /// Whether `generation_config.json`'s sampling values are OpenAI requests' defaults.
    pub model_sampling_defaults: bool,
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
        ("payload-limit", args.api.payload_limit),
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

impl TryFrom<RouterArgs> for RouterConfig {
    type Error = ConfigError;

    fn try_from(args: RouterArgs) -> Result<Self, ConfigError> {
        check_nonzero(&args)?;
        if args.max_input_tokens >= args.max_total_tokens {
            return Err(ConfigError::InputNotBelowTotal {
                max_input_tokens: args.max_input_tokens,
                max_total_tokens: args.max_total_tokens,
            });
        }
        if args.model_id.trim().is_empty() {
            return Err(ConfigError::EmptyModelId);
        }
        if let Some(max_queued_tokens) = args.max_queued_tokens {
            if max_queued_tokens < args.max_total_tokens {
                return Err(ConfigError::QueuedTokensBelowTotal {
                    max_queued_tokens,
                    max_total_tokens: args.max_total_tokens,
                });
            }
        }
        Ok(Self {
            hostname: args.hostname,
            port: args.port,
            shard_uds_paths: args.shard_uds_paths,
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
                payload_limit: args.api.payload_limit,
                always_include_usage: args.api.always_include_usage,
                chat_template: args.api.chat_template,
                chat_completions: !args.api.disable_chat_completions,
                model_sampling_defaults: args.api.generation_config == GenerationConfigUse::Auto,
            },
            request_limits: args.request_limits,
            connections: args.connections,
            api_keys: args.api_keys,
            api_key_files: args.api_key_files,
            launch_id_file: args.launch_id_file,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(extra: &[&str]) -> Result<RouterConfig, ConfigError> {
        let mut argv = vec![
            "tandem-router",
            "--shard-uds-path",
            "/run/s0.sock",
            "--shard-uds-path",
            "/run/s1.sock",
            "--tokenizer-path",
            "/models/m",
            "--model-id",
            "m",
        ];
        argv.extend_from_slice(extra);
        RouterConfig::try_from(RouterArgs::try_parse_from(argv).unwrap())
    }

    #[test]
    fn defaults_and_repeated_shard_paths_in_rank_order() {
        let config = parse(&[]).unwrap();
        let hostname = std::env::var("TANDEM_HOSTNAME").unwrap_or_else(|_| "127.0.0.1".to_owned());
        assert_eq!(config.hostname, hostname);
        assert_eq!(config.lifecycle.step_timeout, Duration::from_secs(120));
        assert_eq!(config.limits.max_queued_tokens, None);
        assert_eq!(config.port, 3000);
        assert_eq!(
            config.shard_uds_paths,
            [PathBuf::from("/run/s0.sock"), PathBuf::from("/run/s1.sock")]
        );
        assert_eq!(config.limits.max_total_tokens, 4096);
        assert_eq!(config.limits.block_size, 16);
        assert_eq!(config.shard_connect_timeout, Duration::from_secs(60));
        assert_eq!(config.lifecycle.max_queue_time, Duration::from_secs(60));
        assert_eq!(
            config.lifecycle.graceful_termination_timeout,
            Duration::from_secs(90)
        );
        assert!(!config.lifecycle.log_requests);
    }

    #[test]
    fn prefix_caching_is_on_unless_turned_off() {
        assert!(parse(&[]).unwrap().limits.prefix_caching);
        let off = parse(&["--prefix-caching", "false"]).unwrap();
        assert!(!off.limits.prefix_caching);
    }

    #[test]
    fn lifecycle_flags_are_parsed() {
        let config = parse(&[
            "--max-queue-time",
            "5",
            "--graceful-termination-timeout",
            "7",
            "--log-requests",
        ])
        .unwrap();
        assert_eq!(config.lifecycle.max_queue_time, Duration::from_secs(5));
        assert_eq!(
            config.lifecycle.graceful_termination_timeout,
            Duration::from_secs(7)
        );
        assert!(config.lifecycle.log_requests);
    }

    #[test]
    fn input_limit_must_be_below_total_limit() {
        let error = parse(&["--max-input-tokens", "4096"]).unwrap_err();
        assert!(
            error.to_string().contains("--max-total-tokens (4096)"),
            "{error}"
        );
    }

    #[test]
    fn zero_sizes_are_rejected() {
        let error = parse(&["--block-size", "0"]).unwrap_err();
        assert_eq!(error, ConfigError::Zero("block-size"));
    }

    #[test]
    fn api_limits_default_to_tgi_values_and_are_parsed() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.api.max_stop_sequences, 4);
        assert_eq!(config.api.max_top_n_tokens, 5);
        assert_eq!(config.api.max_best_of, 2);
        assert_eq!(config.api.max_client_batch_size, 4);
        assert_eq!(config.api.payload_limit, 2_000_000);
        assert!(!config.api.always_include_usage);
        assert!(config.api.chat_completions);
        assert!(config.api.model_sampling_defaults);
        let config = parse(&[
            "--max-stop-sequences",
            "0",
            "--max-best-of",
            "3",
            "--payload-limit",
            "1000",
            "--always-include-usage",
            "--chat-template",
            "/t.jinja",
            "--disable-chat-completions",
            "--generation-config",
            "none",
        ])
        .unwrap();
        assert_eq!(config.api.max_stop_sequences, 0);
        assert_eq!(config.api.max_best_of, 3);
        assert_eq!(config.api.payload_limit, 1000);
        assert!(config.api.always_include_usage);
        assert_eq!(config.api.chat_template, Some(PathBuf::from("/t.jinja")));
        assert!(!config.api.chat_completions);
        assert!(!config.api.model_sampling_defaults);
        let error = parse(&["--max-client-batch-size", "0"]).unwrap_err();
        assert_eq!(error, ConfigError::Zero("max-client-batch-size"));
    }

    #[test]
    fn request_and_connection_limits_default_and_are_parsed() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.request_limits, RequestLimits::default());
        assert_eq!(config.request_limits.max_logit_bias, 300);
        assert_eq!(config.connections.max_connections, 1024);
        assert_eq!(
            config.connections.header_read_timeout(),
            Duration::from_secs(10)
        );
        let config = parse(&[
            "--max-stop-sequence-length",
            "8",
            "--max-stop-token-ids",
            "0",
            "--max-choices",
            "3",
            "--max-connections",
            "5",
            "--header-read-timeout",
            "2",
        ])
        .unwrap();
        assert_eq!(config.request_limits.max_stop_sequence_length, 8);
        assert_eq!(config.request_limits.max_stop_token_ids, 0);
        assert_eq!(config.request_limits.max_choices, 3);
        assert_eq!(config.connections.max_connections, 5);
        assert_eq!(config.connections.header_read_timeout, 2);
        for (flag, name) in [
            ("--max-choices", "max-choices"),
            ("--max-connections", "max-connections"),
            ("--header-read-timeout", "header-read-timeout"),
        ] {
            assert_eq!(parse(&[flag, "0"]).unwrap_err(), ConfigError::Zero(name));
        }
    }

    #[test]
    fn the_hostname_variable_is_not_the_shells_hostname() {
        let args = RouterArgs::command();
        let hostname = args
            .get_arguments()
            .find(|arg| arg.get_id() == "hostname")
            .unwrap();
        assert_eq!(
            hostname.get_env().and_then(|env| env.to_str()),
            Some("TANDEM_HOSTNAME")
        );
    }

    #[test]
    fn api_keys_are_repeatable_or_comma_separated_and_never_shown_in_debug() {
        let config = parse(&[
            "--api-key",
            "sk-one,sk-two",
            "--api-key",
            "sk-three",
            "--api-key-file",
            "/etc/keys",
        ])
        .unwrap();
        let keys: Vec<&str> = config.api_keys.iter().map(|key| key.0.as_str()).collect();
        assert_eq!(keys, ["sk-one", "sk-two", "sk-three"]);
        assert_eq!(config.api_key_files, [PathBuf::from("/etc/keys")]);
        assert!(!format!("{config:?}").contains("sk-one"));
    }

    #[test]
    fn queued_tokens_must_hold_one_full_request() {
        let error = parse(&["--max-queued-tokens", "4095"]).unwrap_err();
        assert_eq!(
            error,
            ConfigError::QueuedTokensBelowTotal {
                max_queued_tokens: 4095,
                max_total_tokens: 4096
            }
        );
        let config = parse(&["--max-queued-tokens", "8192", "--step-timeout", "3"]).unwrap();
        assert_eq!(config.limits.max_queued_tokens, Some(8192));
        assert_eq!(config.lifecycle.step_timeout, Duration::from_secs(3));
        assert_eq!(
            parse(&["--step-timeout", "0"]).unwrap_err(),
            ConfigError::Zero("step-timeout")
        );
    }

    #[test]
    fn shard_socket_is_required() {
        let argv = ["tandem-router", "--tokenizer-path", "/m", "--model-id", "m"];
        assert!(RouterArgs::try_parse_from(argv).is_err());
    }
}
