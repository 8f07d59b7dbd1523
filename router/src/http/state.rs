//! What every handler shares: the backend, the validator, the server's configuration and the
//! admission, authentication and health state.

use std::sync::Arc;

use axum::http::HeaderValue;
use metrics_exporter_prometheus::PrometheusHandle;

use super::middleware::api_keys::ApiKeys;
use super::middleware::caller::Caller;
use super::middleware::draining::Draining;
use super::openai::responses::store::{ResponseStore, ResponseStoreLimits};
use super::ops::deep_health::DeepProbe;
use super::ops::server_info::ServerInfo;
use crate::generation::{Engine, LoadShedder};
use crate::limits::RequestLimits;
use crate::scheduler::Backend;
use crate::stream::TokenDecoding;
use crate::tools::ToolFormat;
use crate::validation::{GenerationParams, SamplingDefaults, Validator};

/// What the handlers enforce and apply. `/info` reports the same values in its own body
/// (`ServerInfo`); both are derived from the router's configuration in `config::derived`.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerConfig {
    /// The served model's name, as responses and `/v1/models` carry it.
    pub model_id: String,
    /// Requests admitted at once (each choice counts); more get 429.
    pub max_concurrent_requests: usize,
    /// Tokens admitted requests may hold before their first token; `None`: no limit
    /// beyond `max_concurrent_requests`.
    pub max_queued_tokens: Option<usize>,
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
    pub request_limits: RequestLimits,
    /// What OpenAI requests that leave these fields unset sample with.
    pub default_sampling: SamplingDefaults,
    /// Seconds since the Unix epoch when the router started; `created` of `/v1/models`.
    pub started_at: u64,
    /// The syntax tool calls are rendered, constrained and parsed in.
    pub tool_format: ToolFormat,
    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served.
    pub runtime_lora_updates: bool,
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub validator: Arc<Validator>,
    pub decoding: Arc<TokenDecoding>,
    pub config: Arc<HandlerConfig>,
    /// `/info`'s body (its KV size is refreshed per request).
    pub info: Arc<ServerInfo>,
    pub metrics: PrometheusHandle,
    /// Set on SIGTERM: new requests get 503 while in-flight ones finish.
    pub draining: Draining,
    /// Whether request and response bodies are logged (`--log-requests`).
    pub(super) log_requests: bool,
    /// Requests and queued tokens in flight; beyond the limits a request gets 429.
    pub(super) load_shedder: LoadShedder,
    /// Keys the protected routes require; `None`: no authentication.
    pub(super) api_keys: Option<ApiKeys>,
    /// The deep health probe every `/health?deep=true` shares.
    pub(super) deep_probe: Arc<DeepProbe>,
    /// Sent with every `/health` answer (`--launch-id-file`); `None`: not sent.
    pub(super) launch_id: Option<HeaderValue>,
    /// Responses kept for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`.
    pub(super) responses: Arc<ResponseStore>,
}

impl AppState {
    /// State whose admission allows `config.max_concurrent_requests` requests and
    /// `config.max_queued_tokens` queued tokens at once.
    pub fn new(
        backend: Arc<dyn Backend>,
        validator: Arc<Validator>,
        decoding: Arc<TokenDecoding>,
        config: HandlerConfig,
        info: ServerInfo,
        metrics: PrometheusHandle,
    ) -> Self {
        let load_shedder =
            LoadShedder::new(config.max_concurrent_requests, config.max_queued_tokens);
        Self {
            backend,
            validator,
            decoding,
            config: Arc::new(config),
            info: Arc::new(info),
            metrics,
            draining: Draining::default(),
            log_requests: false,
            load_shedder,
            api_keys: None,
            deep_probe: Arc::default(),
            launch_id: None,
            responses: Arc::new(ResponseStore::new(ResponseStoreLimits::default())),
        }
    }

    /// Keeps at most what `limits` allow of the responses `/v1/responses` stores.
    #[must_use]
    pub fn with_responses_store(mut self, limits: ResponseStoreLimits) -> Self {
        self.responses = Arc::new(ResponseStore::new(limits));
        self
    }

    /// Requires one of `keys` on every route but `/health`, `/ready` and `/metrics`.
    #[must_use]
    pub fn with_api_keys(mut self, keys: Option<ApiKeys>) -> Self {
        self.api_keys = keys;
        self
    }

    /// Answers every `/health` with `launch_id`, which only the launcher that started this
    /// router knows.
    #[must_use]
    pub fn with_launch_id(mut self, launch_id: Option<HeaderValue>) -> Self {
        self.launch_id = launch_id;
        self
    }

    /// Logs prompts and outputs when `enabled`; they are never logged otherwise.
    #[must_use]
    pub fn with_request_logging(mut self, enabled: bool) -> Self {
        self.log_requests = enabled;
        self
    }

    /// The `model` an answer to a request with `params` names: its LoRA adapter, else the
    /// served model.
    pub fn answering_model(&self, params: &GenerationParams) -> String {
        self.validator
            .lora_adapters()
            .answering(params.adapter.as_ref(), &self.config.model_id)
    }

    /// What starting a generation for `caller` needs from this state.
    pub fn engine(&self, caller: Caller) -> Engine<'_> {
        Engine {
            tenant: caller.0,
            validator: &self.validator,
            admission: &self.load_shedder,
            backend: self.backend.as_ref(),
            decoding: &self.decoding,
        }
    }

    /// Requests admitted and not yet finished (streams included).
    pub fn in_flight(&self) -> usize {
        self.load_shedder.requests_in_flight()
    }
}
