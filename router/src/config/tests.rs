//! Flags parse into the checked configuration, and bad combinations are refused.

use clap::{CommandFactory, Parser};

use super::*;
use crate::shard::KvCacheSize;

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
        config.shard_addresses,
        [
            ShardAddress::Unix(PathBuf::from("/run/s0.sock")),
            ShardAddress::Unix(PathBuf::from("/run/s1.sock"))
        ]
    );
    assert_eq!(config.cluster_secret_file, None);
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
fn async_scheduling_is_on_unless_turned_off() {
    assert!(parse(&[]).unwrap().limits.async_scheduling);
    let off = parse(&["--async-scheduling", "false"]).unwrap();
    assert!(!off.limits.async_scheduling);
}

#[test]
fn prefix_caching_is_on_unless_turned_off() {
    assert!(parse(&[]).unwrap().limits.prefix_caching);
    let off = parse(&["--prefix-caching", "false"]).unwrap();
    assert!(!off.limits.prefix_caching);
}

#[test]
fn drafts_come_from_prompt_lookup_unless_radix_is_chosen_and_radix_needs_the_cache() {
    let defaults = parse(&[]).unwrap().limits;
    assert_eq!(defaults.speculative_method, DraftMethod::Ngram);
    assert_eq!(defaults.speculative_disable_by_batch_size, 4);
    let radix = parse(&["--speculate", "4", "--speculative-method", "radix"]).unwrap();
    assert_eq!(radix.limits.speculative_method, DraftMethod::Radix);
    let uncached = [
        "--speculate",
        "4",
        "--speculative-method",
        "radix",
        "--prefix-caching",
        "false",
    ];
    let error = parse(&uncached).unwrap_err();
    assert!(matches!(error, ConfigError::RadixDraftsWithoutPrefixCache));
    assert!(
        error.to_string().contains("--prefix-caching true"),
        "{error}"
    );
    let argv = ["tandem-router", "--speculative-method", "eagle"];
    let refused = RouterArgs::try_parse_from(argv).unwrap_err().to_string();
    assert!(refused.contains("ngram, radix or draft"), "{refused}");
}

#[test]
fn drafts_from_the_shards_draft_model_need_no_prefix_cache() {
    let flags = ["--speculate", "4", "--speculative-method", "draft"];
    let drafting = parse(&flags).unwrap();
    assert_eq!(drafting.limits.speculative_method, DraftMethod::Model);
    assert_eq!(
        drafting
            .scheduler_config(&KvCacheSize::default(), 0)
            .draft_method,
        DraftMethod::Model
    );
    let uncached = parse(&[&flags[..], &["--prefix-caching", "false"]].concat()).unwrap();
    assert_eq!(uncached.limits.speculative_method, DraftMethod::Model);
}

#[test]
fn info_reports_the_method_and_the_shards_draft_model() {
    let config = parse(&["--speculate", "4", "--speculative-method", "draft"]).unwrap();
    let served = |draft_model: Option<&str>| ServedModel {
        architecture: "LlamaForCausalLM".to_owned(),
        dtype: "float32".to_owned(),
        device: "cpu".to_owned(),
        weights_format: String::new(),
        weight_bytes: 0,
        draft_model: draft_model.map(str::to_owned),
        recurrent_state: false,
        num_shards: 2,
    };
    let kv_cache = KvCacheSize {
        num_blocks: 10,
        bytes: 11 * 16 * 576,
        ..KvCacheSize::default()
    };
    let info = config.server_info(
        served(Some("LlamaForCausalLM, 2 layers")),
        kv_cache,
        Default::default(),
    );
    assert_eq!(
        (info.kv_cache_tokens, info.kv_cache_bytes_per_token),
        (160, 576)
    );
    assert_eq!((info.speculate, info.speculative_method), (4, "draft"));
    assert_eq!(
        info.speculative_model.as_deref(),
        Some("LlamaForCausalLM, 2 layers")
    );
    let body = serde_json::to_value(config.server_info(served(None), kv_cache, Default::default()))
        .expect("the body serializes");
    assert_eq!(body["speculative_model"], serde_json::Value::Null);
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
    let error = parse(&["--max-image-pixels", "0"]).unwrap_err();
    assert_eq!(error, ConfigError::Zero("max-image-pixels"));
}

#[test]
fn image_limits_are_parsed_into_the_request_limits() {
    let config = parse(&["--max-images-per-request", "2", "--max-image-bytes", "100"]).unwrap();
    let images = config.request_limits.images;
    assert_eq!(
        (images.max_images_per_request, images.max_image_bytes),
        (2, 100)
    );
    assert_eq!(images.max_image_pixels, 4096 * 4096);
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

#[test]
fn the_responses_store_is_bounded_by_entries_and_bytes() {
    let defaults = parse(&[]).unwrap().api.responses_store;
    assert_eq!((defaults.max_entries, defaults.max_bytes), (1024, 64 << 20));
    let tiny = parse(&[
        "--responses-store-max-entries",
        "2",
        "--responses-store-max-bytes",
        "4096",
    ])
    .unwrap()
    .api
    .responses_store;
    assert_eq!((tiny.max_entries, tiny.max_bytes), (2, 4096));
}

#[test]
fn shard_uris_name_local_and_remote_ranks_in_rank_order() {
    let argv = [
        "tandem-router",
        "--shard-uri",
        "unix:///run/s0.sock",
        "--shard-uri",
        "http://10.0.0.8:50051",
        "--cluster-secret-file",
        "/run/secret",
        "--tokenizer-path",
        "/m",
        "--model-id",
        "m",
    ];
    let config = RouterConfig::try_from(RouterArgs::try_parse_from(argv).unwrap()).unwrap();
    assert_eq!(
        config.shard_addresses,
        [
            ShardAddress::Unix(PathBuf::from("/run/s0.sock")),
            ShardAddress::Tcp("http://10.0.0.8:50051".to_owned())
        ]
    );
    assert_eq!(
        config.cluster_secret_file,
        Some(PathBuf::from("/run/secret"))
    );
}

#[test]
fn shard_uris_and_socket_paths_are_exclusive_and_checked() {
    let base = ["tandem-router", "--tokenizer-path", "/m", "--model-id", "m"];
    let both = [
        &base[..],
        &["--shard-uds-path", "/s", "--shard-uri", "unix:///s"],
    ]
    .concat();
    assert!(RouterArgs::try_parse_from(both).is_err());
    let bad = [&base[..], &["--shard-uri", "https://host:1"]].concat();
    let error = RouterArgs::try_parse_from(bad).unwrap_err().to_string();
    assert!(
        error.contains("unix:///absolute/path or http://host:port"),
        "{error}"
    );
}

#[test]
fn kv_events_are_off_by_default_and_replay_needs_an_event_endpoint() {
    let defaults = parse(&[]).unwrap().kv_events;
    assert_eq!(defaults.endpoint, None);
    assert_eq!(
        (defaults.topic.as_str(), defaults.hash_seed.as_str()),
        ("kv-events", "0")
    );
    let on = parse(&[
        "--kv-events-endpoint",
        "tcp://*:5557",
        "--kv-events-replay-endpoint",
        "tcp://*:5558",
    ])
    .unwrap()
    .kv_events;
    assert_eq!(on.endpoint.as_deref(), Some("tcp://*:5557"));
    assert_eq!(on.replay_endpoint.as_deref(), Some("tcp://*:5558"));
    let argv = [
        "tandem-router",
        "--shard-uds-path",
        "/run/s0.sock",
        "--tokenizer-path",
        "/m",
        "--model-id",
        "m",
        "--kv-events-replay-endpoint",
        "tcp://*:5558",
    ];
    assert!(RouterArgs::try_parse_from(argv).is_err());
}

#[test]
fn a_model_with_recurrent_state_and_no_state_checkpoint_turns_prefix_reuse_off() {
    let mut config = parse(&[]).unwrap();
    assert!(config.limits.prefix_caching);
    assert!(!config.fit_prefix_reuse_to_model(false, 0));
    assert!(
        !config.fit_prefix_reuse_to_model(true, 4),
        "checkpoints resume its prefixes"
    );
    assert!(config.limits.prefix_caching);
    assert!(config.fit_prefix_reuse_to_model(true, 0));
    assert!(!config.limits.prefix_caching);
    let kv_cache = KvCacheSize {
        num_blocks: 8,
        ..KvCacheSize::default()
    };
    assert!(!config.scheduler_config(&kv_cache, 0).prefix_caching);
    let served = ServedModel {
        architecture: "Lfm2ForCausalLM".to_owned(),
        dtype: "float32".to_owned(),
        device: "cpu".to_owned(),
        weights_format: String::new(),
        weight_bytes: 0,
        draft_model: None,
        recurrent_state: true,
        num_shards: 1,
    };
    let kv_cache = KvCacheSize {
        num_blocks: 10,
        bytes: 11 * 16 * 576,
        ..KvCacheSize::default()
    };
    let body = serde_json::to_value(config.server_info(served, kv_cache, Default::default()))
        .expect("the body serializes");
    assert_eq!(body["prefix_caching"], false);
    assert_eq!(body["model_recurrent_state"], true);
}

#[test]
fn the_state_checkpoint_interval_is_whole_blocks() {
    let config = parse(&["--state-checkpoint-interval", "20", "--block-size", "16"]).unwrap();
    assert_eq!(config.limits.state_checkpoint_interval, 32);
    assert_eq!(parse(&[]).unwrap().limits.state_checkpoint_interval, 512);
    assert_eq!(parse(&[]).unwrap().limits.max_state_checkpoints, 64);
}

#[test]
fn the_default_payload_limit_grows_by_one_base64_image_for_a_model_that_reads_images() {
    let mut config = parse(&["--max-image-bytes", "3000"]).unwrap();
    assert_eq!(config.fit_payload_limit_to_images(false), None);
    assert_eq!(config.api.payload_limit, 2_000_000);
    assert_eq!(config.fit_payload_limit_to_images(true), Some(2_004_000));
    assert_eq!(config.api.payload_limit, 2_004_000);
    let mut explicit = parse(&["--payload-limit", "5000", "--max-image-bytes", "3000"]).unwrap();
    assert_eq!(explicit.fit_payload_limit_to_images(true), None);
    assert_eq!(explicit.api.payload_limit, 5000);
}
