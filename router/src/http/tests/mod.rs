//! HTTP behaviour through `app()` with a scripted fake `Backend`.

mod admission;
mod api_limits;
mod auth;
mod bounds;
mod cache_hints;
mod cached_usage;
mod chat_endings;
mod connections;
mod echo_logprobs;
mod error_messages;
mod errors;
mod fuzz;
mod hostile;
mod launch_identity;
mod lifecycle;
mod logprobs;
mod lora;
mod native;
mod openai;
mod openapi;
mod prompts;
mod reasoning;
mod siblings;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::{app, AppState, HandlerConfig, ServerInfo};
use crate::limits::{ConnectionLimits, RequestLimits};
use crate::scheduler::{
    AdapterUpdateError, Backend, FinishReason, GeneratedToken, GenerationEvent, GenerationRequest,
    GenerationStream, LoadSnapshot, SchedulerError, TokenLogprob,
};
use crate::shard::LoraAdapterInfo;
use crate::stream::TokenDecoding;
use crate::tools::ToolFormat;
use crate::validation::{testing, ChatTemplate, Limits, ModelFiles, SamplingDefaults, Validator};

pub const MODEL_ID: &str = "test-model";
pub const MAX_INPUT_TOKENS: usize = 64;
pub const MAX_TOTAL_TOKENS: usize = 128;
pub const PAYLOAD_LIMIT: usize = 64 * 1024;

/// What the fake engine does with every request.
#[derive(Debug, Clone)]
pub enum Script {
    /// Emits these tokens; the last one carries the finish reason.
    Tokens(Vec<u32>, FinishReason),
    /// Emits these tokens, then keeps the request open forever.
    Hold(Vec<u32>),
    /// Emits these tokens, then fails.
    FailAfter(Vec<u32>, SchedulerError),
    /// Refuses the submission.
    Refuse(SchedulerError),
}

/// A `Backend` that plays a `Script` and records what it was given.
pub struct FakeBackend {
    script: Script,
    pub requests: Mutex<Vec<GenerationRequest>>,
    pub senders: Mutex<Vec<mpsc::UnboundedSender<GenerationEvent>>>,
    healthy: bool,
    /// Whether token logprobs fall with `seed % 4`, so sampled candidates can be ranked.
    logprob_by_seed: bool,
    /// Deep health probes received.
    pub deep_probes: std::sync::atomic::AtomicUsize,
    /// What a deep probe answers besides the plain health.
    deep_failure: Option<SchedulerError>,
    /// LoRA adapter loads and unloads the shards carried out, as `load NAME` / `unload NAME`.
    pub lora_updates: Mutex<Vec<String>>,
    /// What `requests_under_adapter` answers.
    pub requests_under_adapter: std::sync::atomic::AtomicUsize,
}

impl FakeBackend {
    pub fn new(script: Script) -> Arc<Self> {
        Self::with_health(script, true)
    }

    /// A backend whose token logprob is `-0.25 - 0.5 * (seed % 4)`.
    pub fn ranked_by_seed(script: Script) -> Arc<Self> {
        Arc::new(Self {
            logprob_by_seed: true,
            ..Self::fields(script, true)
        })
    }

    pub fn unhealthy() -> Arc<Self> {
        Self::with_health(Script::Hold(vec![]), false)
    }

    /// Healthy, but a deep probe fails with `error`.
    pub fn deep_failing(error: SchedulerError) -> Arc<Self> {
        Arc::new(Self {
            deep_failure: Some(error),
            ..Self::fields(Script::Hold(vec![]), true)
        })
    }

    fn with_health(script: Script, healthy: bool) -> Arc<Self> {
        Arc::new(Self::fields(script, healthy))
    }

    fn fields(script: Script, healthy: bool) -> Self {
        Self {
            script,
            requests: Mutex::new(Vec::new()),
            senders: Mutex::new(Vec::new()),
            healthy,
            logprob_by_seed: false,
            deep_probes: std::sync::atomic::AtomicUsize::new(0),
            deep_failure: None,
            lora_updates: Mutex::new(Vec::new()),
            requests_under_adapter: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Whether every request's stream has been dropped (cancelled or finished).
    pub fn all_streams_closed(&self) -> bool {
        self.senders.lock().unwrap().iter().all(|s| s.is_closed())
    }
}

/// A token as the shard reports it: alternatives only when the request asked for them.
fn token(id: u32, logprob: f32, finish: Option<FinishReason>, with_top: bool) -> GenerationEvent {
    GenerationEvent::Token(GeneratedToken {
        id,
        logprob,
        // The chosen token first, as greedy decoding produces it.
        top_logprobs: if with_top {
            vec![
                TokenLogprob { id, logprob },
                TokenLogprob {
                    id: id + 1,
                    logprob: -1.5,
                },
            ]
        } else {
            Vec::new()
        },
        finish,
    })
}

#[async_trait::async_trait]
impl Backend for FakeBackend {
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
        if let Script::Refuse(error) = &self.script {
            return Err(error.clone());
        }
        let with_top = request.logprobs.top_logprobs > 0;
        #[allow(clippy::cast_precision_loss)]
        let logprob = if self.logprob_by_seed {
            -0.25 - (request.sampling.seed % 4) as f32 * 0.5
        } else {
            -0.25
        };
        // As if the prefix cache held the first half of every prompt.
        let cached_tokens = request.input_ids.len() / 2;
        self.requests.lock().unwrap().push(request);
        let (sender, events) = mpsc::unbounded_channel();
        let _ = sender.send(GenerationEvent::Started { cached_tokens });
        let (ids, last) = match &self.script {
            Script::Tokens(ids, reason) => (ids.clone(), Some(*reason)),
            Script::Hold(ids) | Script::FailAfter(ids, _) => (ids.clone(), None),
            Script::Refuse(_) => unreachable!(),
        };
        for (index, &id) in ids.iter().enumerate() {
            let finish = if index + 1 == ids.len() { last } else { None };
            let _ = sender.send(token(id, logprob, finish, with_top));
        }
        if let Script::FailAfter(_, error) = &self.script {
            let _ = sender.send(GenerationEvent::Error(error.clone()));
        }
        self.senders.lock().unwrap().push(sender);
        Ok(GenerationStream { events })
    }

    fn load(&self) -> LoadSnapshot {
        LoadSnapshot::default()
    }

    async fn health(&self) -> Result<(), SchedulerError> {
        if self.healthy {
            Ok(())
        } else {
            Err(SchedulerError::ShardFailed("rank 0 is gone".into()))
        }
    }

    async fn deep_health(&self) -> Result<(), SchedulerError> {
        self.deep_probes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.health().await?;
        self.deep_failure.clone().map_or(Ok(()), Err)
    }

    /// Loads any path but `/bad`, which the shards refuse.
    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, AdapterUpdateError> {
        if path == "/bad" {
            return Err(AdapterUpdateError::Refused {
                name: name.to_owned(),
                message: "lora_B of q_proj has shape [8, 4], expected [64, 8]".to_owned(),
            });
        }
        self.lora_updates
            .lock()
            .unwrap()
            .push(format!("load {name}"));
        Ok(LoraAdapterInfo::named(name))
    }

    async fn unload_lora_adapter(&self, name: &str) -> Result<(), AdapterUpdateError> {
        self.lora_updates
            .lock()
            .unwrap()
            .push(format!("unload {name}"));
        Ok(())
    }

    async fn requests_under_adapter(&self, _name: &str) -> usize {
        self.requests_under_adapter
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The test server's handler configuration, admitting `max_concurrent_requests` at once.
pub fn handler_config(max_concurrent_requests: usize) -> HandlerConfig {
    HandlerConfig {
        model_id: MODEL_ID.to_owned(),
        max_concurrent_requests,
        max_queued_tokens: None,
        max_top_n_tokens: 5,
        max_best_of: 4,
        max_client_batch_size: 3,
        payload_limit: PAYLOAD_LIMIT,
        always_include_usage: false,
        request_limits: RequestLimits::default(),
        default_sampling: SamplingDefaults::default(),
        started_at: 1,
        tool_format: ToolFormat::default(),
        runtime_lora_updates: true,
    }
}

/// `/info`'s body for a test server whose handlers run with `config`.
pub fn server_info_for(config: &HandlerConfig) -> ServerInfo {
    ServerInfo {
        model_id: config.model_id.clone(),
        model_dtype: "float32".to_owned(),
        model_device_type: "cpu".to_owned(),
        model_weights_format: "qkv_proj: float32".to_owned(),
        model_weight_bytes: 1 << 20,
        model_recurrent_state: false,
        state_checkpoints: 0,
        state_checkpoint_bytes: 0,
        model_architecture: "LlamaForCausalLM".to_owned(),
        num_shard: 1,
        max_concurrent_requests: config.max_concurrent_requests,
        max_queued_tokens: config.max_queued_tokens,
        max_input_tokens: MAX_INPUT_TOKENS,
        max_total_tokens: MAX_TOTAL_TOKENS,
        max_batch_prefill_tokens: 256,
        max_batch_size: 8,
        max_stop_sequences: 4,
        max_top_n_tokens: config.max_top_n_tokens,
        max_best_of: config.max_best_of,
        max_client_batch_size: config.max_client_batch_size,
        payload_limit: config.payload_limit,
        always_include_usage: config.always_include_usage,
        request_limits: config.request_limits,
        connections: ConnectionLimits {
            max_connections: 1024,
            header_read_timeout: 10,
        },
        default_sampling: config.default_sampling,
        validation_workers: 512,
        block_size: 16,
        prefix_caching: true,
        speculate: 0,
        speculative_method: "ngram",
        speculative_model: None,
        kv_cache_blocks: 100,
        kv_cache_tokens: 1600,
        kv_cache_bytes_per_token: 576,
        compiled_decode_rows: None,
        compiling: None,
        router: "tandem-router",
        version: "0.0.0",
    }
}

/// The app over `backend`, with the test model directory and `max_concurrent` permits.
pub fn test_app(backend: Arc<FakeBackend>, max_concurrent: usize) -> axum::Router {
    test_app_with(backend, handler_config(max_concurrent))
}

/// The app over `backend` with the handlers' configuration `config`.
/// A backend that answers every request with the tokens of "ok", stopped by length.
pub fn ok_backend() -> Arc<FakeBackend> {
    FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length))
}

pub fn test_app_with(backend: Arc<FakeBackend>, config: HandlerConfig) -> axum::Router {
    app(test_state(backend, config))
}

/// The state over `backend` and the test model directory, limited as `config` says.
pub fn test_state(backend: Arc<dyn Backend>, config: HandlerConfig) -> AppState {
    test_state_adapted(backend, config, |validator| validator)
}

/// Like `test_state`, its validator changed by `adapt` first.
pub fn test_state_adapted(
    backend: Arc<dyn Backend>,
    config: HandlerConfig,
    adapt: impl FnOnce(Validator) -> Validator,
) -> AppState {
    let dir = testing::chat_model_dir();
    let files = ModelFiles::load(dir.path()).unwrap();
    let template = ChatTemplate::new(
        files.chat_template.unwrap(),
        files.bos_token,
        files.eos_token,
    )
    .unwrap();
    let tokenizer = Arc::new(files.tokenizer);
    let limits = Limits {
        max_input_tokens: MAX_INPUT_TOKENS,
        max_total_tokens: MAX_TOTAL_TOKENS,
        max_stop_sequences: 4,
    };
    let validator = adapt(
        Validator::new(Arc::clone(&tokenizer), Ok(template), limits)
            .with_request_limits(config.request_limits),
    );
    state_with_validator(backend, validator, TokenDecoding::new(tokenizer), config)
}

/// The state over `backend` with a validator and detokenizer built elsewhere (as start-up
/// builds them).
pub fn state_with_validator(
    backend: Arc<dyn Backend>,
    validator: Validator,
    decoding: TokenDecoding,
    config: HandlerConfig,
) -> AppState {
    let info = server_info_for(&config);
    AppState::new(
        backend,
        Arc::new(validator),
        Arc::new(decoding),
        config,
        info,
        crate::metrics::detached_handle(),
    )
}

/// The prompt the fake engine received last, decoded with its special tokens.
pub fn last_prompt(backend: &FakeBackend) -> String {
    let requests = backend.requests.lock().unwrap();
    let ids = &requests.last().unwrap().input_ids;
    testing::tokenizer().decode(ids, false).unwrap()
}

/// The ids the fake engine emits for `text`.
pub fn ids(text: &str) -> Vec<u32> {
    testing::encode(text)
}

/// A response read to its end.
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    /// The SSE payloads parsed as JSON (skipping `[DONE]`).
    pub fn json_events(&self) -> Vec<Value> {
        self.events()
            .iter()
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }
}

pub async fn send(app: &axum::Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        content_type,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

pub fn post_request(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

pub async fn post(app: &axum::Router, path: &str, body: &str) -> Reply {
    send(app, post_request(path, body)).await
}

pub async fn get(app: &axum::Router, path: &str) -> Reply {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}
