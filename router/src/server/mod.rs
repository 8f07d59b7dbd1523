//! Start-up: tokenizer, shards, KV cache, scheduler, then the HTTP server until a signal.

#[cfg(test)]
mod chat_tests;
mod serving;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tool_format_tests;

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use metrics_exporter_prometheus::BuildError;
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

use crate::config::{RouterConfig, ServedModel};
use crate::http::{self, ApiKeyError, ApiKeys, AppState, LaunchIdError};
use crate::images::{FetcherSetupError, ImageTokens, ImageTokensError, MediaFetcher};
use crate::kv::{self, events::PublisherError};
use crate::reasoning::ReasoningParser;
use crate::scheduler::{self, Backend, DraftMethod, RecoveryConfig};
use crate::shard::{ClusterAuth, KvCacheSize, ModelInfo, ShardError, ShardFleet, WarmupPlan};
use crate::stream::TokenDecoding;
use crate::tools::ToolFormat;
use crate::validation::{
    tokenization_peak_bytes, ChatTemplate, ChatUnavailable, GrammarCompiler, LoraAdapters,
    ModelFiles, ModelFilesError, SamplingDefaults, TemplateSource, TemplateSourceError, Validator,
};

/// Why the router could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot load the tokenizer: {0}")]
    ModelFiles(#[from] ModelFilesError),
    #[error("the chat template does not compile: {0}")]
    ChatTemplate(#[from] minijinja::Error),
    #[error(transparent)]
    ChatTemplateSource(#[from] TemplateSourceError),
    #[error("shard start-up failed: {0}")]
    Shard(#[from] ShardError),
    #[error("--speculative-method draft drafts with the shards' draft model, but they run none (their Info names no draft_model): start them with one, or choose --speculative-method ngram or radix")]
    NoDraftModel,
    #[error("the shards allocated no KV cache blocks; give them more memory or lower --max-batch-prefill-tokens")]
    NoKvBlocks,
    #[error("--max-total-tokens ({max_total_tokens}) exceeds the model's context of {max_position_embeddings} positions")]
    ExceedsModelContext {
        max_total_tokens: usize,
        max_position_embeddings: usize,
    },
    #[error("images: {0}")]
    Images(#[from] ImageTokensError),
    #[error(transparent)]
    MediaFetcher(#[from] FetcherSetupError),
    #[error("API keys: {0}")]
    ApiKeys(#[from] ApiKeyError),
    #[error(transparent)]
    LaunchId(#[from] LaunchIdError),
    #[error(transparent)]
    KvEvents(#[from] PublisherError),
    #[error("cannot set up metrics: {0}")]
    Metrics(#[from] BuildError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Installs the log subscriber: human-readable, or JSON lines with `json`. `RUST_LOG`
/// overrides the default `info` level.
pub fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    // Fails only when a subscriber is already installed (a second run in one process).
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Runs the router until SIGINT/SIGTERM, then drains in-flight requests.
pub async fn run(mut config: RouterConfig) -> Result<(), StartupError> {
    let inline_keys: Vec<String> = config.api_keys.iter().map(|key| key.0.clone()).collect();
    let api_keys = ApiKeys::load(&inline_keys, &config.api_key_files)?;
    let launch_id = config
        .launch_id_file
        .as_deref()
        .map(http::read_launch_id)
        .transpose()?;
    let metrics = crate::metrics::install()?;
    let phase = Instant::now();
    let files = ModelFiles::load(&config.tokenizer_path)?;
    info!(
        path = %config.tokenizer_path.display(),
        chat_template = files.chat_template.is_some(),
        elapsed_ms = phase.elapsed().as_millis(),
        "tokenizer loaded"
    );
    let vocab = files.tokenizer.get_vocab_size(true);
    let sampling_defaults = model_sampling_defaults(&files, &config);
    let (validator, decoding, tool_format) = tokenization(files, &config)?;
    let (fleet, model) = connect_shards(&config).await?;
    check_model_fits(&config, &model)?;
    check_draft_model(&config, &model)?;
    let image_tokens = image_tokens(&mut config, &model, &decoding)?;
    let validator = bound_to_model(validator, vocab, &model, &config)
        .with_image_tokens(image_tokens, config.limits.max_batch_prefill_tokens)
        .with_media_fetcher(MediaFetcher::new(config.media_fetch.clone())?);
    let phase = Instant::now();
    let kv_cache = warmup(&fleet, &config).await?;
    info!(elapsed_ms = phase.elapsed().as_millis(), "warmup done");
    if config.fit_prefix_reuse_to_model(model.recurrent_state, kv_cache.state_checkpoints) {
        info!(
            architecture = %model.architecture,
            "prefix caching off: this model keeps a recurrent state per sequence, and the \
             shards keep no state checkpoint to resume it after a cached prefix \
             (--max-state-checkpoints)"
        );
    }
    let backend = start_scheduler(&config, &fleet, &kv_cache, model.max_loras).await?;
    let served = ServedModel {
        architecture: model.architecture.clone(),
        dtype: model.dtype.clone(),
        device: model.device.clone(),
        weights_format: model.weights_format.clone(),
        weight_bytes: model.weight_bytes,
        draft_model: model.draft_model.clone(),
        recurrent_state: model.recurrent_state,
        num_shards: fleet.num_shards(),
    };
    let info = config.server_info(served, kv_cache, sampling_defaults);
    info.record_metric();
    let state = AppState::new(
        backend,
        Arc::new(validator),
        Arc::new(decoding),
        config.handler_config(sampling_defaults, tool_format),
        info,
        metrics,
    )
    .with_request_logging(config.lifecycle.log_requests)
    .with_api_keys(api_keys.clone())
    .with_launch_id(launch_id)
    .with_responses_store(config.api.responses_store);
    match api_keys {
        Some(keys) => {
            info!(
                keys = keys.count(),
                "API keys required on every route but /health, /ready and /metrics"
            );
            http::reload_api_keys_on_sighup(keys);
        }
        None => warn!("no API key configured: every route is open"),
    }
    serving::serve(&config, state).await
}

/// How the model's prompts hold images (`None`: it reads text only); a model that reads them
/// takes bodies big enough for one, unless `--payload-limit` says otherwise.
fn image_tokens(
    config: &mut RouterConfig,
    model: &ModelInfo,
    decoding: &TokenDecoding,
) -> Result<Option<ImageTokens>, StartupError> {
    let image_tokens = ImageTokens::for_encoder(
        &config.tokenizer_path,
        model.vision_encoder.as_deref(),
        &decoding.tokenizer,
    )?;
    let step_tokens = config.limits.max_batch_prefill_tokens;
    if let Some(most) = image_tokens
        .as_ref()
        .map(|tokens| tokens.span.token_bounds().1)
    {
        if most > step_tokens {
            warn!(
                max_batch_prefill_tokens = step_tokens,
                "images whose span takes more than {step_tokens} tokens are refused, as a step \
                 computes no more (--max-batch-prefill-tokens); the largest spans take {most}"
            );
        }
    }
    if let Some(limit) = config.fit_payload_limit_to_images(image_tokens.is_some()) {
        info!(
            payload_limit = limit,
            "request bodies up to {limit} bytes: 2,000,000 for text plus one base64 image of \
             --max-image-bytes (--payload-limit sets another bound)"
        );
    }
    Ok(image_tokens)
}

/// Connects to every rank (with the cluster secret, if any) and reads the model's facts.
async fn connect_shards(config: &RouterConfig) -> Result<(ShardFleet, ModelInfo), StartupError> {
    let phase = Instant::now();
    let auth = ClusterAuth::from_file(config.cluster_secret_file.as_deref())?;
    let fleet =
        ShardFleet::connect(&config.shard_addresses, config.shard_connect_timeout, auth).await?;
    let model = fleet.info().await?;
    info!(
        shards = fleet.num_shards(),
        architecture = %model.architecture,
        dtype = %model.dtype,
        device = %model.device,
        attention = %model.attention_backend,
        draft_model = model.draft_model.as_deref().unwrap_or("none"),
        elapsed_ms = phase.elapsed().as_millis(),
        "shards connected"
    );
    Ok((fleet, model))
}

/// The scheduler over `fleet`'s `num_blocks` KV blocks; its prefix cache publishes KV-cache
/// events when `--kv-events-endpoint` is set.
async fn start_scheduler(
    config: &RouterConfig,
    fleet: &ShardFleet,
    kv_cache: &KvCacheSize,
    max_loras: usize,
) -> Result<Arc<dyn Backend>, StartupError> {
    let recovery = RecoveryConfig::new(
        warmup_plan(config),
        config.lifecycle.max_queue_time,
        config.lifecycle.step_timeout,
    );
    let kv_events = kv::events::start(&config.kv_events).await?;
    Ok(scheduler::spawn(
        config.scheduler_config(kv_cache, max_loras),
        recovery,
        crate::shard::traced(Arc::new(fleet.clone())),
        kv_events,
    ))
}

/// The model must hold `max_total_tokens` positions (0 means the shard did not say).
fn check_model_fits(config: &RouterConfig, model: &ModelInfo) -> Result<(), StartupError> {
    let max_position_embeddings = model.max_position_embeddings;
    let max_total_tokens = config.limits.max_total_tokens;
    if max_position_embeddings > 0 && max_total_tokens > max_position_embeddings {
        return Err(StartupError::ExceedsModelContext {
            max_total_tokens,
            max_position_embeddings,
        });
    }
    Ok(())
}

/// Drafts from the shards' draft model (`--speculative-method draft`) need shards that run one.
fn check_draft_model(config: &RouterConfig, model: &ModelInfo) -> Result<(), StartupError> {
    let limits = &config.limits;
    let drafts_with_model = limits.speculate > 0 && limits.speculative_method == DraftMethod::Model;
    if drafts_with_model && model.draft_model.is_none() {
        return Err(StartupError::NoDraftModel);
    }
    Ok(())
}

/// Requests end on the model's EOS ids and grammars allow them: read once, from the shards'
/// `Info` (the shard reads them from `config.json` and `generation_config.json`). Token ids
/// must exist in the model's embedding as well as in the tokenizer (a model vocabulary of 0
/// means the shard did not say).
fn bound_to_model(
    validator: Validator,
    tokenizer_vocab: usize,
    model: &ModelInfo,
    config: &RouterConfig,
) -> Validator {
    let mut validator = validator
        .with_eos_token_ids(model.eos_token_ids.clone())
        .with_lora_adapters(lora_adapters(config, model));
    if let Some(grammars) = grammar_compiler(config, &model.eos_token_ids) {
        validator = validator.with_grammars(Arc::new(grammars));
    }
    let model_vocab = model.vocab_size;
    if tokenizer_vocab > model_vocab {
        warn!(
            tokenizer_vocab,
            model_vocab = model.vocab_size,
            "the tokenizer has more tokens than the model"
        );
    }
    if model_vocab == 0 {
        return validator;
    }
    validator.with_model_vocab_size(model_vocab)
}

/// The adapters the shards hold, logged once.
fn lora_adapters(config: &RouterConfig, model: &ModelInfo) -> LoraAdapters {
    for adapter in &model.lora_adapters {
        info!(
            name = %adapter.name,
            rank = adapter.rank,
            target_modules = %adapter.target_modules.join(","),
            max_loras = model.max_loras,
            "LoRA adapter served"
        );
    }
    let names = model
        .lora_adapters
        .iter()
        .map(|adapter| adapter.name.clone());
    LoraAdapters::new(&config.model_id, names)
}

/// The Warmup sent at start-up and again after every shard restart.
fn warmup_plan(config: &RouterConfig) -> WarmupPlan {
    let limits = &config.limits;
    WarmupPlan {
        block_size: limits.block_size,
        max_batch_tokens: limits.max_batch_prefill_tokens,
        max_batch_requests: limits.max_batch_size,
        max_drafts: limits.speculate,
        max_drafting_requests: if limits.speculate > 0 {
            limits
                .speculative_disable_by_batch_size
                .min(limits.max_batch_size)
        } else {
            0
        },
        max_state_checkpoints: if limits.prefix_caching {
            limits.max_state_checkpoints
        } else {
            0
        },
    }
}

async fn warmup(fleet: &ShardFleet, config: &RouterConfig) -> Result<KvCacheSize, StartupError> {
    let limits = &config.limits;
    let answer = fleet.warmup(warmup_plan(config)).await?;
    let num_blocks = answer.num_blocks;
    if num_blocks == 0 {
        return Err(StartupError::NoKvBlocks);
    }
    let tokens = num_blocks * limits.block_size;
    let blocks_per_request = limits.max_total_tokens.div_ceil(limits.block_size);
    let full_requests = num_blocks / blocks_per_request;
    info!(
        blocks = num_blocks,
        tokens,
        bytes = answer.bytes,
        requests_at_max_total_tokens = full_requests,
        "KV cache: {num_blocks} blocks of {} tokens = {tokens} tokens, room for {full_requests} requests of {} tokens",
        limits.block_size,
        limits.max_total_tokens
    );
    if full_requests == 0 {
        warn!(
            tokens,
            max_total_tokens = limits.max_total_tokens,
            "the KV cache cannot hold one request of --max-total-tokens; long requests will be refused"
        );
    }
    if answer.offload.is_on() {
        info!(
            host_slots = answer.offload.host,
            disk_slots = answer.offload.disk,
            block_bytes = answer.offload_block_bytes,
            "KV offload: evicted blocks kept in {} host-memory slots and {} disk slots of {} bytes each",
            answer.offload.host,
            answer.offload.disk,
            answer.offload_block_bytes
        );
    }
    if answer.state_checkpoints > 0 {
        info!(
            checkpoints = answer.state_checkpoints,
            bytes = answer.state_checkpoint_bytes,
            interval = limits.state_checkpoint_interval,
            "state checkpoints: {} copies of one sequence's recurrent state ({} bytes), taken every \
             {} prompt tokens, at the end of each prompt and along each answer",
            answer.state_checkpoints,
            answer.state_checkpoint_bytes,
            limits.state_checkpoint_interval
        );
    }
    Ok(answer)
}

/// The sampling values OpenAI requests default to: generation_config.json's, unless
/// `--generation-config none`.
fn model_sampling_defaults(files: &ModelFiles, config: &RouterConfig) -> SamplingDefaults {
    let recommended = files.sampling_defaults;
    if !config.api.model_sampling_defaults || recommended.is_empty() {
        return SamplingDefaults::default();
    }
    info!(
        defaults = ?recommended,
        "OpenAI requests sample with generation_config.json's values where they set none \
         (--generation-config none turns this off)"
    );
    recommended
}

/// Compiles the chat template and builds the validator and detokenizer from the model files,
/// and picks the tool-call syntax. A model without a chat template starts: chat uses its
/// family's known template, or is refused while completions are served.
fn tokenization(
    files: ModelFiles,
    config: &RouterConfig,
) -> Result<(Validator, TokenDecoding, ToolFormat), StartupError> {
    let source = TemplateSource::choose(
        &files,
        config.api.chat_template.as_deref(),
        config.api.chat_completions,
    )?;
    log_template_source(&source, files.model_type.as_deref());
    let text = source.into_text();
    let tool_format = ToolFormat::choose(
        config.api.tool_call_parser,
        text.as_deref().ok(),
        &files.tokenizer,
    );
    info!(
        parser = tool_format.family.parser_name(),
        "tool calls use the {} syntax (--tool-call-parser sets another)",
        tool_format.family.parser_name()
    );
    let reasoning = reasoning_parser(config, text.as_deref().ok(), &files);
    let chat_template = match text {
        Ok(text) => Ok(ChatTemplate::new(text, files.bos_token, files.eos_token)?),
        Err(reason) => Err(reason),
    };
    let tokenizer = Arc::new(files.tokenizer);
    let limits = config.validation_limits();
    let validator = Validator::new(Arc::clone(&tokenizer), chat_template, limits)
        .with_reasoning_parser(reasoning)
        .with_request_limits(config.request_limits)
        .with_max_drafts(config.limits.speculate)
        .with_scheduling_policy(config.limits.scheduling_policy)
        .with_tokenization_budget(
            TOKENIZATION_BUDGET_BODIES * tokenization_peak_bytes(config.api.payload_limit),
        );
    let reasoning_markers = reasoning
        .map(ReasoningParser::chat_markers)
        .unwrap_or_default();
    let decoding = TokenDecoding::new(tokenizer).with_chat_markers(
        tool_format
            .family
            .chat_markers()
            .iter()
            .chain(reasoning_markers)
            .copied(),
    );
    Ok((validator, decoding, tool_format))
}

/// The reasoning format chat output is split by (`--reasoning-parser`, else the template's
/// markers), logged once.
fn reasoning_parser(
    config: &RouterConfig,
    template: Option<&str>,
    files: &ModelFiles,
) -> Option<ReasoningParser> {
    let parser = config
        .api
        .reasoning_parser
        .resolve(template, files.model_type.as_deref());
    if let Some(parser) = parser {
        info!(?parser, "chat output splits reasoning from the answer");
    }
    parser
}

/// Warns when the model's own chat template is missing: chat then runs on a stand-in, or not
/// at all.
fn log_template_source(source: &TemplateSource, model_type: Option<&str>) {
    let model_type = model_type.unwrap_or("unknown");
    match source {
        TemplateSource::Fallback(known) => warn!(
            family = known.family,
            model_type,
            "the model has no chat template: chat uses the {} format as a fallback \
             (--chat-template FILE sets the template)",
            known.family
        ),
        TemplateSource::Unavailable(ChatUnavailable::NoTemplate) => warn!(
            model_type,
            "the model has no chat template and none is known for its family: chat requests \
             are refused until the router starts with --chat-template FILE; completions are served"
        ),
        TemplateSource::Given(_) | TemplateSource::Unavailable(ChatUnavailable::Disabled) => {}
    }
}

/// How many `/tokenize` answers for bodies of `--payload-limit` bytes are worked on at once.
const TOKENIZATION_BUDGET_BODIES: usize = 2;

/// The grammar engine over the model's vocabulary; without one, grammar requests get a 4xx.
fn grammar_compiler(config: &RouterConfig, eos_token_ids: &[u32]) -> Option<GrammarCompiler> {
    let started = Instant::now();
    match GrammarCompiler::load(&config.tokenizer_path.join("tokenizer.json"), eos_token_ids) {
        Ok(compiler) => {
            info!(
                elapsed_ms = started.elapsed().as_millis(),
                "grammar engine ready"
            );
            Some(compiler.with_max_bytes(config.request_limits.max_grammar_bytes))
        }
        Err(error) => {
            warn!(%error, "structured output and tools are disabled");
            None
        }
    }
}
