use prost::Message;

use super::*;
use crate::kv::OffloadSlots;
use crate::shard::sampling::{LogprobOptions, StoppingParams};

#[test]
fn warmup_sizes_beyond_the_contract_saturate() {
    let plan = WarmupPlan {
        block_size: 16,
        max_batch_tokens: usize::MAX,
        max_batch_requests: 8,
        max_drafts: 4,
        max_drafting_requests: usize::MAX,
        max_state_checkpoints: usize::MAX,
    };
    let request = pb::WarmupRequest::from(plan);
    assert_eq!(
        (
            request.block_size,
            request.max_batch_tokens,
            request.max_batch_requests,
            request.max_drafts,
            request.max_drafting_requests,
            request.max_state_checkpoints
        ),
        (16, u32::MAX, 8, 4, u32::MAX, u32::MAX)
    );
}

#[test]
fn bytes_per_token_counts_the_reserved_block() {
    // 10 blocks handed out and 1 reserved, of 16 tokens each, at 576 bytes per token.
    let size = KvCacheSize {
        num_blocks: 10,
        bytes: 11 * 16 * 576,
        ..KvCacheSize::default()
    };
    assert_eq!(size.bytes_per_token(16), 576);
    assert_eq!(KvCacheSize::default().bytes_per_token(0), 0);
}

#[test]
fn model_facts_and_the_kv_cache_keep_their_values() {
    let info = ModelInfo::from(pb::InfoResponse {
        architecture: "LlamaForCausalLM".to_owned(),
        vocab_size: 32_000,
        max_position_embeddings: 4096,
        eos_token_ids: vec![2],
        ..pb::InfoResponse::default()
    });
    assert_eq!(info.architecture, "LlamaForCausalLM");
    assert_eq!(
        (info.vocab_size, info.max_position_embeddings),
        (32_000, 4096)
    );
    assert_eq!(info.eos_token_ids, vec![2]);
    assert_eq!(info.draft_model, None, "an empty name means no draft model");
    let drafting = ModelInfo::from(pb::InfoResponse {
        draft_model: "LlamaForCausalLM, 2 layers".to_owned(),
        ..pb::InfoResponse::default()
    });
    assert_eq!(
        drafting.draft_model.as_deref(),
        Some("LlamaForCausalLM, 2 layers")
    );
    let cache = KvCacheSize::from(pb::WarmupResponse {
        num_blocks: 7,
        kv_cache_bytes: 1 << 20,
        num_state_checkpoints: 3,
        state_checkpoint_bytes: 3 << 10,
        num_host_offload_slots: 40,
        num_disk_offload_slots: 900,
        offload_block_bytes: 8 << 10,
    });
    assert_eq!(
        cache,
        KvCacheSize {
            num_blocks: 7,
            bytes: 1 << 20,
            state_checkpoints: 3,
            state_checkpoint_bytes: 3 << 10,
            offload: OffloadSlots {
                host: 40,
                disk: 900,
            },
            offload_block_bytes: 8 << 10,
        }
    );
}

#[test]
fn a_new_request_sends_neutral_sampling_values_as_the_contracts_zero() {
    let request = pb::NewRequest::from(NewRequest {
        id: 3,
        token_ids: vec![1, 2, 3],
        num_output_tokens: 1,
        sampling: SamplingParams {
            temperature: 0.7,
            logit_bias: vec![(5, -1.5)],
            ..SamplingParams::default()
        },
        stopping: StoppingParams {
            max_new_tokens: 9,
            ..Default::default()
        },
        logprobs: LogprobOptions::default(),
        grammar: Some(Grammar::Regex("a+".to_owned())),
        lora_adapter: Some("sql".into()),
        images: vec![crate::images::PromptImage {
            data: bytes::Bytes::from_static(b"png"),
            digest: [7; 32],
            offset: 1,
            num_tokens: 2,
        }],
    });
    assert_eq!(request.lora_adapter, "sql");
    let image = &request.images[0];
    assert_eq!(
        (
            &image.data[..],
            &image.digest[..],
            image.offset,
            image.num_tokens
        ),
        (&b"png"[..], &[7; 32][..], 1, 2)
    );
    let sampling = request.sampling.expect("sampling is always sent");
    assert_eq!(
        (
            sampling.top_p,
            sampling.typical_p,
            sampling.repetition_penalty
        ),
        (0.0, 0.0, 0.0)
    );
    assert_eq!(sampling.temperature, 0.7);
    assert_eq!(sampling.logit_bias.get(&5), Some(&-1.5));
    assert_eq!(request.stopping.map(|s| s.max_new_tokens), Some(9));
    assert_eq!(
        request.grammar.and_then(|g| g.kind),
        Some(pb::grammar::Kind::Regex("a+".to_owned()))
    );
}

#[test]
fn span_counts_beyond_the_contract_saturate() {
    let span = pb::ScheduledRequest::from(ScheduledSpan {
        id: 1,
        num_tokens: usize::MAX,
        new_block_ids: vec![4],
        num_computed_tokens: 16,
        draft_token_ids: vec![7, 8],
        num_model_drafts: 0,
        restore_state_checkpoint: None,
        save_state_checkpoint: Some(3),
    });
    assert_eq!((span.num_tokens, span.num_computed_tokens), (u32::MAX, 16));
    assert_eq!(span.draft_token_ids, vec![7, 8]);
    assert_eq!(span.num_model_drafts, 0);
    assert_eq!(
        (span.restore_state_checkpoint, span.save_state_checkpoint),
        (None, Some(3))
    );
}

#[test]
fn a_span_asking_the_draft_model_sends_its_count_and_no_draft_tokens() {
    let span = |num_model_drafts| ScheduledSpan {
        id: 2,
        num_tokens: 1,
        new_block_ids: vec![5],
        num_computed_tokens: 9,
        draft_token_ids: Vec::new(),
        num_model_drafts,
        restore_state_checkpoint: Some(0),
        save_state_checkpoint: None,
    };
    let sent = pb::ScheduledRequest::from(span(4));
    let received = pb::ScheduledRequest::decode(sent.encode_to_vec().as_slice())
        .expect("a message decodes from its own encoding");
    assert_eq!(received, sent);
    assert_eq!(
        (received.num_model_drafts, received.draft_token_ids),
        (4, vec![])
    );
    assert_eq!(
        (
            received.id,
            received.num_tokens,
            received.num_computed_tokens
        ),
        (2, 1, 9)
    );
    let saturated = pb::ScheduledRequest::from(span(usize::MAX));
    assert_eq!(saturated.num_model_drafts, u32::MAX);
}

#[test]
fn an_answer_keeps_each_requests_outcome_and_unknown_codes_read_as_none_or_model() {
    let answer = StepAnswer::from(pb::StepResponse {
        generations: vec![
            pb::Generation {
                id: 1,
                token_id: 42,
                finish_reason: pb::FinishReason::StopToken as i32,
                ..pb::Generation::default()
            },
            pb::Generation {
                id: 2,
                token_id: 43,
                finish_reason: 99,
                ..pb::Generation::default()
            },
        ],
        failures: vec![
            pb::RequestFailure {
                id: 3,
                kind: pb::FailureKind::Grammar as i32,
                message: "broken".to_owned(),
            },
            pb::RequestFailure {
                id: 4,
                kind: 99,
                message: String::new(),
            },
        ],
        shard_total_ms: 19.0,
        ..pb::StepResponse::default()
    });
    let finishes: Vec<_> = answer.generations.iter().map(|g| g.token.finish).collect();
    assert_eq!(finishes, vec![Some(FinishReason::StopToken), None]);
    let kinds: Vec<_> = answer.failures.iter().map(|f| f.failure.kind).collect();
    assert_eq!(
        kinds,
        vec![RequestFailureKind::Grammar, RequestFailureKind::Model]
    );
    assert_eq!(answer.timings.total_ms, 19.0);
}

#[test]
fn an_answer_carries_what_has_compiled_and_a_shard_that_says_nothing_compiled_nothing() {
    let answer = StepAnswer::from(pb::StepResponse {
        compilation: Some(pb::Compilation {
            decode_rows: 32,
            compiling: false,
        }),
        ..pb::StepResponse::default()
    });
    assert_eq!(
        answer.compilation,
        Compilation {
            decode_rows: 32,
            compiling: false,
        }
    );
    let silent = StepAnswer::from(pb::StepResponse::default());
    assert_eq!(silent.compilation, Compilation::default());
}
