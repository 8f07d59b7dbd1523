//! `/info`'s body: the served model, the limits and the KV cache size, also published as the
//! `tandem_info` gauge.

use serde::Serialize;
use utoipa::ToSchema;

use crate::limits::{ConnectionLimits, RequestLimits};
use crate::validation::SamplingDefaults;

/// What `/info` reports: the model, the limits and the KV cache size (TGI's `Info` plus
/// Tandem's KV facts).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ServerInfo {
    pub model_id: String,
    pub model_dtype: String,
    pub model_device_type: String,
    pub model_architecture: String,
    /// How the GEMM weights are stored, by role (`--quantize`), e.g. `qkv_proj: Q4_1 as int4`.
    pub model_weights_format: String,
    /// Bytes one shard's weights take in memory.
    pub model_weight_bytes: u64,
    /// Whether the model keeps a recurrent state per sequence beside its KV cache (a hybrid
    /// such as LFM2); such a model resumes cached prefixes from state checkpoints.
    pub model_recurrent_state: bool,
    pub num_shard: usize,
    pub max_concurrent_requests: usize,
    /// Tokens admitted requests may hold before their first token; `None`: no limit
    /// beyond `max_concurrent_requests`.
    pub max_queued_tokens: Option<usize>,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_batch_prefill_tokens: usize,
    pub max_batch_size: usize,
    /// Most stop strings per request.
    pub max_stop_sequences: usize,
    /// Most alternatives per token `top_n_tokens` may ask for.
    pub max_top_n_tokens: u32,
    /// Most candidates `best_of` may ask for.
    pub max_best_of: usize,
    /// Most prompts one `/v1/completions` request may list.
    pub max_client_batch_size: usize,
    /// Largest accepted request body in bytes.
    pub payload_limit: usize,
    /// Whether every OpenAI stream ends with a usage chunk.
    pub always_include_usage: bool,
    #[serde(flatten)]
    pub request_limits: RequestLimits,
    #[serde(flatten)]
    pub connections: ConnectionLimits,
    /// What OpenAI requests that leave these fields unset sample with: the model's
    /// generation_config.json recommendations (`--generation-config auto`); empty for none.
    pub default_sampling: SamplingDefaults,
    /// Most prompts tokenized at once (the blocking pool tokenization runs on).
    pub validation_workers: usize,
    pub block_size: usize,
    /// Whether requests reuse the KV blocks of cached prefixes (`--prefix-caching`; false for a
    /// model with recurrent state whose shards keep no state checkpoint).
    pub prefix_caching: bool,
    /// Speculative decoding: draft tokens per decode step (0: off).
    pub speculate: usize,
    /// Where drafts come from (`--speculative-method`): `ngram`, `radix` or `draft`.
    pub speculative_method: &'static str,
    /// The shards' draft model, which `draft` drafts with (`<architecture>, <N> layers`); null
    /// when they run none.
    pub speculative_model: Option<String>,
    pub kv_cache_blocks: usize,
    pub kv_cache_tokens: usize,
    /// Bytes one token takes in one rank's KV cache, all layers together.
    pub kv_cache_bytes_per_token: u64,
    /// A model with recurrent state: the state checkpoints each rank keeps (0 otherwise), and
    /// the bytes they take on one rank.
    pub state_checkpoints: usize,
    pub state_checkpoint_bytes: u64,
    /// Decode steps of up to this many rows run a compiled graph (`--torch-compile`; 0: none),
    /// as of the shards' latest step; null before the first one.
    pub compiled_decode_rows: Option<u32>,
    /// Whether the shards still compile decode graphs in the background, as of their latest
    /// step; null before the first one.
    pub compiling: Option<bool>,
    pub router: &'static str,
    pub version: &'static str,
}

impl ServerInfo {
    /// Sets the `tandem_info` gauge to 1 with the served model and the limits as labels.
    pub fn record_metric(&self) {
        let labels = [
            ("model_id", self.model_id.clone()),
            ("architecture", self.model_architecture.clone()),
            ("dtype", self.model_dtype.clone()),
            ("device", self.model_device_type.clone()),
            ("num_shards", self.num_shard.to_string()),
            ("block_size", self.block_size.to_string()),
            ("kv_cache_blocks", self.kv_cache_blocks.to_string()),
            (
                "max_concurrent_requests",
                self.max_concurrent_requests.to_string(),
            ),
            ("max_input_tokens", self.max_input_tokens.to_string()),
            ("max_total_tokens", self.max_total_tokens.to_string()),
            (
                "max_batch_prefill_tokens",
                self.max_batch_prefill_tokens.to_string(),
            ),
            ("max_batch_size", self.max_batch_size.to_string()),
            ("version", self.version.to_owned()),
        ];
        metrics::gauge!("tandem_info", &labels).set(1.0);
    }
}

/// Threads tokio's blocking pool runs at most, which bounds concurrent tokenizations.
pub const VALIDATION_WORKERS: usize = 512;
